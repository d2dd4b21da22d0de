#include "service/e2b/e2b_request.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "protocol/json_depth.hpp"
#include "service/problem.hpp"

namespace agentvm {

void require_method(const HttpExchange& exchange, const char* method)
{
    if (exchange.method() != method)
        throw RefusedRequest(ServiceError::method_not_allowed,
                             fmt::format("{} takes {}, not {}", exchange.path(), method, exchange.method()));
}

Json json_body(const HttpExchange& exchange)
{
    if (exchange.body().empty())
        return Json::object();
    if (!json_depth_within(exchange.body()))
        throw RefusedRequest(ServiceError::bad_json,
                             fmt::format("the body nests arrays and objects deeper than {} levels", max_json_depth));
    Json body = Json::parse(exchange.body(), nullptr, false);
    if (!body.is_object())
        throw RefusedRequest(ServiceError::bad_json, "the body must be a JSON object");
    return body;
}

std::string media_type(std::string_view content_type)
{
    std::string_view type = content_type.substr(0, content_type.find(';'));
    while (!type.empty() && (type.front() == ' ' || type.front() == '\t'))
        type.remove_prefix(1);
    while (!type.empty() && (type.back() == ' ' || type.back() == '\t'))
        type.remove_suffix(1);
    std::string lower(type);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower;
}

} // namespace agentvm
