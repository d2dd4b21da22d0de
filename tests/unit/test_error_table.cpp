// docs/api.md's error table lists every code the native API can answer, with the status it
// answers it with, and nothing else: a code added to serve without its row fails here.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "service/native/native_wire.hpp"
#include "service/problem.hpp"

using namespace agentvm;

namespace {

// Every (status, code) pair of the table's rows: "| 409 | `paused`, `busy` | when |".
std::set<std::pair<int, std::string>> documented_errors()
{
    std::ifstream file(AGENTVM_API_DOC);
    REQUIRE(file);
    std::stringstream text;
    text << file.rdbuf();
    const std::string doc = text.str();
    const size_t start = doc.find("**Errors**");
    REQUIRE(start != std::string::npos);
    const size_t end = doc.find("\n\n", doc.find("|---|", start));
    std::istringstream table(doc.substr(start, end - start));
    std::set<std::pair<int, std::string>> out;
    const std::regex row(R"(^\| (\d{3}) \| ([^|]*) \|)");
    const std::regex code("`([a-z_]+)`");
    for (std::string line; std::getline(table, line);) {
        std::smatch match;
        if (!std::regex_search(line, match, row))
            continue;
        const int status = std::stoi(match[1]);
        const std::string codes = match[2];
        for (auto it = std::sregex_iterator(codes.begin(), codes.end(), code); it != std::sregex_iterator(); ++it)
            out.emplace(status, (*it)[1]);
    }
    return out;
}

} // namespace

TEST_CASE("every code the native API answers is in docs/api.md's error table, with its status")
{
    const auto documented = documented_errors();
    std::set<std::pair<int, std::string>> answered;
    for (ServiceError code : all_service_errors())
        answered.emplace(native_status(code), std::string(error_name(code)));
    for (const AgentErrorStatus& entry : native_agent_statuses())
        answered.emplace(entry.status, std::string(entry.code));
    for (const auto& [status, code] : answered) {
        INFO("missing row: | ", status, " | `", code, "` |");
        CHECK(documented.contains({status, code}));
    }
    for (const auto& [status, code] : documented) {
        INFO("a row serve never answers: | ", status, " | `", code, "` |");
        CHECK(answered.contains({status, code}));
    }
}

TEST_CASE("every ServiceError has a distinct name")
{
    std::set<std::string_view> names;
    for (ServiceError code : all_service_errors())
        CHECK(names.insert(error_name(code)).second);
}
