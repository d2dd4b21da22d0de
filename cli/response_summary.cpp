#include "cli/response_summary.hpp"

#include <nlohmann/json.hpp>

namespace agentvm {
namespace {

using nlohmann::json;

class Summarizer : public nlohmann::json_sax<json> {
public:
    ResponseSummary summary;
    bool is_object = false;

    bool null() override { return scalar(json(nullptr)); }
    bool boolean(bool value) override { return scalar(json(value)); }
    bool number_integer(number_integer_t value) override { return scalar(json(value)); }
    bool number_unsigned(number_unsigned_t value) override { return scalar(json(value)); }
    bool number_float(number_float_t value, const string_t&) override { return scalar(json(value)); }
    bool string(string_t& value) override { return scalar(json(std::move(value))); }
    bool binary(binary_t&) override { return scalar(json()); }

    bool start_object(std::size_t) override
    {
        if (depth_ == 0)
            is_object = true;
        return open();
    }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override { return open(); }
    bool end_array() override { return close(); }

    bool key(string_t& name) override
    {
        if (depth_ == 1) {
            in_id_ = name == "id";
            if (name == "event")
                summary.is_event = true;
        }
        return true;
    }

    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override
    {
        return false;
    }

private:
    bool scalar(const json& value)
    {
        if (depth_ == 1 && in_id_) {
            summary.id = value.dump();
            in_id_ = false;
        }
        return true;
    }
    bool open()
    {
        // A structured "id" is no id at all: the agent only ever echoes scalars.
        if (depth_ == 1)
            in_id_ = false;
        ++depth_;
        return true;
    }
    bool close()
    {
        --depth_;
        return true;
    }

    int depth_ = 0;
    bool in_id_ = false;
};

} // namespace

std::optional<std::string> leading_id(std::string_view partial_line)
{
    constexpr std::string_view start = "{\"id\":";
    if (!partial_line.starts_with(start))
        return std::nullopt;
    const std::string_view rest = partial_line.substr(start.size());
    size_t end = 0;
    if (rest.starts_with('"')) {
        // A string ends at its first unescaped quote.
        for (end = 1; end < rest.size() && rest[end] != '"'; ++end)
            if (rest[end] == '\\')
                ++end;
        if (end >= rest.size())
            return std::nullopt;
        ++end;
    } else {
        // A number ends where its characters do; only a byte after it proves it complete.
        end = rest.find_first_not_of("+-.0123456789eE");
        if (end == 0 || end == std::string_view::npos)
            return std::nullopt;
    }
    const json id = json::parse(rest.substr(0, end), nullptr, false);
    if (id.is_discarded() || !(id.is_string() || id.is_number()))
        return std::nullopt;
    return id.dump();
}

std::optional<ResponseSummary> summarize_response(std::string_view line)
{
    Summarizer summarizer;
    if (!json::sax_parse(line, &summarizer) || !summarizer.is_object)
        return std::nullopt;
    return summarizer.summary;
}

} // namespace agentvm
