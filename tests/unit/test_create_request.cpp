// POST /v1/sandboxes' body: defaults, every field, and a 400 naming each mistake.
#include <doctest/doctest.h>

#include "service/create_request.hpp"
#include "service/problem.hpp"

using namespace agentvm;

namespace {

std::string refusal(const std::string& body)
{
    try {
        parse_create_request(body);
    } catch (const RefusedRequest& e) {
        return std::string(error_name(e.code)) + ": " + e.what();
    }
    return "accepted";
}

} // namespace

TEST_CASE("an empty body is every default")
{
    const CreateRequest request = parse_create_request("");
    CHECK(request.pool.empty());
    CHECK(request.settings.timeout == std::chrono::seconds(300));
    CHECK_FALSE(request.settings.idle_timeout);
    CHECK(request.settings.env.empty());
    CHECK(request.settings.metadata == Json::object());
}

TEST_CASE("every field is taken")
{
    const CreateRequest request = parse_create_request(
        R"({"pool":"p","timeout":12.4,"idle_timeout":5,"env":{"A_1":"x y"},"metadata":{"k":"v"}})");
    CHECK(request.pool == "p");
    CHECK(request.settings.timeout == std::chrono::seconds(12));
    CHECK(request.settings.idle_timeout == std::chrono::seconds(5));
    CHECK(request.settings.env.at("A_1") == "x y");
    CHECK(request.settings.metadata == Json{{"k", "v"}});
}

TEST_CASE("\"template\" names the pool too, as E2B's clients call it")
{
    CHECK(parse_create_request(R"({"template":"swe"})").pool == "swe");
    CHECK(parse_create_request(R"({"template":"swe","pool":"swe"})").pool == "swe");
    CHECK(refusal(R"({"template":"swe","pool":"other"})").find("name different pools") != std::string::npos);
    CHECK(refusal(R"({"template":3})").find("\"template\" must be") != std::string::npos);
}

TEST_CASE("each mistake is refused by name")
{
    CHECK(refusal("[1]") == "bad_json: the body must be a JSON object");
    CHECK(refusal("{") == "bad_json: the body must be a JSON object");
    CHECK(refusal(R"({"timeout":0})").find("\"timeout\" must be") != std::string::npos);
    CHECK(refusal(R"({"timeout":86401})").find("\"timeout\" must be") != std::string::npos);
    CHECK(refusal(R"({"timeout":"5"})").find("\"timeout\" must be") != std::string::npos);
    CHECK(refusal(R"({"idle_timeout":-1})").find("\"idle_timeout\" must be") != std::string::npos);
    CHECK(refusal(R"({"env":{"1A":"x"}})").find("not a variable name") != std::string::npos);
    CHECK(refusal(R"({"env":{"A-B":"x"}})").find("not a variable name") != std::string::npos);
    CHECK(refusal(R"({"env":{"A":1}})").find("must be a string without NUL") != std::string::npos);
    CHECK(refusal(R"({"env":{"A":"a\u0000b"}})").find("must be a string without NUL") != std::string::npos);
    CHECK(refusal(R"({"metadata":{"k":1}})").find("\"metadata\"") != std::string::npos);
    CHECK(refusal(R"({"pool":""})").find("\"pool\" must be") != std::string::npos);
    CHECK(refusal(R"({"tmeout":5})").find("unknown field \"tmeout\"") != std::string::npos);
    std::string many = "{\"metadata\":{";
    for (int i = 0; i < 65; ++i)
        many += (i ? "," : "") + std::string("\"k") + std::to_string(i) + "\":\"v\"";
    CHECK(refusal(many + "}}").find("at most 64") != std::string::npos);
}
