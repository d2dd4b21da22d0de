// Seconds given as floating point on the command line: what cannot become whole milliseconds
// is refused by the option's own check, which names the option.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/seconds_option.hpp"

using namespace agentvm;

namespace {

// Parses `--timeout VALUE`; the error text, or "" when accepted.
std::string parse(const std::string& value, bool zero_allowed = false, double* out = nullptr)
{
    CLI::App app;
    double seconds = 60;
    app.add_option("--timeout", seconds)->check(seconds_option(zero_allowed, 1000));
    std::vector<std::string> args{value, "--timeout"};  // CLI11 parses a reversed vector
    try {
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        return e.what();
    }
    if (out)
        *out = seconds;
    return "";
}

} // namespace

TEST_CASE("seconds options: NaN, infinities, negatives and values past the cap are refused by name")
{
    for (const std::string bad : {"nan", "-nan", "inf", "-inf", "infinity", "-1", "-0.001", "1000.5", "1e300", "0", "x"}) {
        INFO("value " << bad);
        const std::string err = parse(bad);
        CHECK(err.find("--timeout") != std::string::npos);
        CHECK(err.find("seconds") != std::string::npos);
    }
}

TEST_CASE("seconds options: finite values in range are taken and convert to whole milliseconds")
{
    double seconds = 0;
    CHECK(parse("2.5", false, &seconds).empty());
    CHECK(seconds == 2.5);
    CHECK(seconds_to_ms(seconds).count() == 2500);
    CHECK(parse("1000").empty());
    CHECK(parse("0.0004", false, &seconds).empty());
    CHECK(seconds_to_ms(seconds).count() == 0);
    // 0 means "no limit" where it is allowed.
    CHECK(parse("0", true, &seconds).empty());
    CHECK(seconds == 0);
    CHECK_FALSE(parse("-1", true).empty());
    CHECK(seconds_to_ms(max_option_seconds).count() == 31'536'000'000);
}

TEST_CASE("bounded numbers (--cpu-quota): NaN, infinities, negatives and values past the cap are refused")
{
    const auto parse_cores = [](const std::string& value, double* out = nullptr) -> std::string {
        CLI::App app;
        double cores = -1;
        app.add_option("--cpu-quota", cores)->check(bounded_number(64, "cores"));
        std::vector<std::string> args{value, "--cpu-quota"};
        try {
            app.parse(args);
        } catch (const CLI::ParseError& e) {
            return e.what();
        }
        if (out)
            *out = cores;
        return "";
    };
    for (const std::string bad : {"nan", "inf", "-inf", "-1", "64.5", "1e300", "x"}) {
        INFO("value " << bad);
        const std::string err = parse_cores(bad);
        CHECK(err.find("--cpu-quota") != std::string::npos);
        CHECK(err.find("cores") != std::string::npos);
    }
    double cores = -1;
    CHECK(parse_cores("0", &cores).empty());
    CHECK(cores == 0);
    CHECK(parse_cores("1.5", &cores).empty());
    CHECK(cores == 1.5);
    CHECK(parse_cores("64").empty());
}
