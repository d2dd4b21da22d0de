// A doctest reporter that writes TAP (the Test Anything Protocol) for meson's `protocol:
// 'tap'`: one result per check, so the vm and hostile tiers, whose test cases check one
// scenario of a script each with CHECK_MESSAGE(…, name), are counted scenario by scenario,
// and a scenario that never ran fails its own check. Run with `--reporters=tap --success`
// (without --success doctest hands the reporter failed checks only).
//
// A passing check's line names its message (the innermost INFO, CHECK_MESSAGE's, when it is
// one short line) or else its expression; a failing one adds every active INFO as diagnostics ("# " lines), which is
// where these tests put the script's output.
#include <doctest/doctest.h>

#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>

namespace {

using namespace doctest;

// One line of at most 160 bytes, for a TAP description.
std::string one_line(std::string text)
{
    for (char& c : text)
        if (c == '\n' || c == '\r' || c == '#')
            c = ' ';
    constexpr size_t max = 160;
    if (text.size() > max)
        text = text.substr(0, max) + "...";
    return text;
}

class TapReporter : public IReporter {
public:
    explicit TapReporter(const ContextOptions& options) : out_(*options.cout) {}

    void report_query(const QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const TestRunStats&) override
    {
        if (count_ == 0)
            result(false, "no check ran: nothing was tested", "");
        out_ << "1.." << count_ << std::endl;
    }
    void test_case_start(const TestCaseData& test) override { test_case_ = test.m_name; }
    void test_case_reenter(const TestCaseData&) override {}
    void test_case_end(const CurrentTestCaseStats&) override {}
    void test_case_exception(const TestCaseException& e) override
    {
        result(false, test_case_ + ": " + (e.is_crash ? "crashed: " : "threw: ") + e.error_string.c_str(), "");
    }
    void subcase_start(const SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const AssertData& check) override
    {
        std::lock_guard<std::mutex> lock(mutex_);
        const int contexts = get_num_active_contexts();
        std::string name = check.m_expr;
        std::ostringstream diagnostics;
        if (contexts > 0) {
            // CHECK_MESSAGE's message, short; a long one is an INFO of the output around it.
            std::ostringstream innermost;
            get_active_contexts()[contexts - 1]->stringify(&innermost);
            const std::string message = innermost.str();
            if (message.size() <= 80 && message.find('\n') == std::string::npos)
                name = message;
        }
        if (check.m_failed) {
            diagnostics << check.m_file << ":" << check.m_line << ": " << check.m_expr;
            if (check.m_decomp.size() > 0)
                diagnostics << " is " << check.m_decomp.c_str();
            if (check.m_threw)
                diagnostics << " threw " << check.m_exception.c_str();
            diagnostics << "\n";
            for (int i = 0; i < contexts; ++i)
                get_active_contexts()[i]->stringify(&diagnostics);
        }
        result(!check.m_failed, test_case_ + ": " + name, diagnostics.str());
    }
    void log_message(const MessageData&) override {}
    void test_case_skipped(const TestCaseData& test) override
    {
        // A skipped check is never a pass here.
        result(false, std::string(test.m_name) + ": skipped", "");
    }

private:
    void result(bool ok, const std::string& what, const std::string& diagnostics)
    {
        out_ << (ok ? "ok " : "not ok ") << ++count_ << " - " << one_line(what) << "\n";
        std::istringstream lines(diagnostics);
        for (std::string line; std::getline(lines, line);)
            out_ << "# " << line << "\n";
        out_.flush();
    }

    std::ostream& out_;
    std::mutex mutex_;
    std::string test_case_;
    int count_ = 0;
};

} // namespace

REGISTER_REPORTER("tap", 1, TapReporter);
