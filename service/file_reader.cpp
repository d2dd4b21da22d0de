#include "service/file_reader.hpp"

namespace agentvm {

uint64_t read_file_stream(const std::shared_ptr<Sandbox>& sandbox, const std::string& path,
                          FileReaderHandlers handlers, const std::optional<std::string>& user)
{
    auto on_data = std::move(handlers.on_data);
    CallHandlers call;
    call.on_event = [on_data = std::move(on_data)](Json&& event) {
        std::optional<std::string> bytes;
        try {
            bytes = get_bytes(event, "data");
        } catch (const CallError&) {
            // A malformed data event carries no bytes; the call's answer still comes.
        }
        if (bytes)
            on_data(std::move(*bytes));
    };
    call.on_answer = std::move(handlers.on_done);
    Json request{{"op", "read_file"}, {"path", path}};
    if (user)
        request["user"] = *user;
    return sandbox->call(request, request, std::move(call));
}

} // namespace agentvm
