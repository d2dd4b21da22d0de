// What a SandboxFusion request (/run_code, /run_jupyter) brings back from its sandbox is
// bounded whatever the guest answers: fetched files by one budget per request, refused
// before a byte is read when stat shows a file that is not regular or too large, and counted
// on the bytes that arrive when stat lied; a cell's output, result and exception cut to what
// it asked for.
#include <doctest/doctest.h>

#include <string>

#include "service/fusion/fusion_job.hpp"
#include "service/fusion/run_jupyter.hpp"

using namespace agentvm;

TEST_CASE("a fetched file that is not a regular file, or larger than what is left, is refused before it is read")
{
    const FetchBudget budget(1000);
    // stat follows links: a link to /dev/zero is a char device.
    const auto zero = budget.refuse("out.bin", Json{{"ok", true}, {"type", "char"}, {"size", 0}});
    REQUIRE(zero);
    CHECK(zero->find("not a regular file (char)") != std::string::npos);
    CHECK(budget.refuse("fifo", Json{{"type", "fifo"}, {"size", 0}}));
    CHECK(budget.refuse("dir", Json{{"type", "dir"}, {"size", 4096}}));
    CHECK(budget.refuse("forged", Json{{"type", 7}, {"size", 0}}));
    CHECK(budget.refuse("no size", Json{{"type", "file"}}));
    // A sparse file of a TiB.
    const auto sparse = budget.refuse("big", Json{{"type", "file"}, {"size", uint64_t{1} << 40}});
    REQUIRE(sparse);
    CHECK(sparse->find("--fusion-fetch-max") != std::string::npos);
    CHECK_FALSE(budget.refuse("ok", Json{{"type", "file"}, {"size", 1000}}));
}

TEST_CASE("the bytes that arrive are counted against one budget per request, whatever stat said")
{
    FetchBudget budget(10);
    std::string first;
    CHECK(budget.take(first, "abcdef"));
    CHECK(first == "abcdef");
    CHECK(budget.left() == 4);
    std::string second;
    CHECK(budget.take(second, "ghij"));  // exactly what was left
    CHECK_FALSE(budget.take(second, "k"));
    CHECK(second == "ghij");
    CHECK(budget.left() == 0);
    // stat of the next file is refused by what is left, not the whole budget.
    CHECK(budget.refuse("third", Json{{"type", "file"}, {"size", 1}}));
}

TEST_CASE("a cell keeps at most what it asked for of its output, result and exception")
{
    const std::string big(5000, 'x');
    const Json answer{{"result", big},
                      {"exception", {{"type", big + big}, {"message", std::string(1 << 20, 'm')},
                                     {"traceback", std::string(1 << 20, 't')}}},
                      {"stdout", big},
                      {"stderr_b64", "AP8="}};
    const Json cell = jupyter_cell_result(answer, 100);
    CHECK(cell["stdout"].get<std::string>() == std::string(100, 'x'));
    CHECK(cell["stderr"] == std::string("\0\xff", 2));
    CHECK(cell["display"][0]["text/plain"].get<std::string>().size() == 100);
    CHECK(cell["error"][0]["evalue"].get<std::string>().size() == jupyter_exception_text_kept);
    CHECK(cell["error"][0]["traceback"][0].get<std::string>().size() == jupyter_exception_text_kept);
    // A cell with room keeps its result whole, up to the agent's 1 MiB.
    const Json roomy = jupyter_cell_result(Json{{"result", std::string(2 << 20, 'r')}}, uint64_t{16} << 20);
    CHECK(roomy["display"][0]["text/plain"].get<std::string>().size() == jupyter_result_kept);
    CHECK(output_of(Json{{"stdout", "hello"}}, "stdout", 2) == "he");
}
