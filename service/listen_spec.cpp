#include "service/listen_spec.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {

bool ListenSpec::loopback() const
{
    return tcp && (host == "localhost" || host == "::1" || host.starts_with("127."));
}

std::string ListenSpec::text() const
{
    const std::string from = inherited_fd >= 0 ? " (from systemd)" : "";
    if (!tcp)
        return "unix:" + path + from;
    return (host.find(':') != std::string::npos ? fmt::format("tcp:[{}]:{}", host, port)
                                                : fmt::format("tcp:{}:{}", host, port)) + from;
}

ListenSpec parse_listen_spec(const std::string& text)
{
    ListenSpec spec;
    if (text.starts_with("unix:")) {
        spec.path = text.substr(5);
        if (spec.path.empty())
            throw Error(fmt::format("--listen {}: give a socket path after unix:", text));
        return spec;
    }
    if (!text.starts_with("tcp:"))
        throw Error(fmt::format("--listen {}: expected unix:PATH or tcp:HOST:PORT", text));
    spec.tcp = true;
    std::string rest = text.substr(4);
    size_t colon = 0;
    if (rest.starts_with("[")) {
        const size_t close = rest.find(']');
        if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
            throw Error(fmt::format("--listen {}: expected tcp:[IPV6]:PORT", text));
        spec.host = rest.substr(1, close - 1);
        colon = close + 1;
    } else {
        colon = rest.rfind(':');
        if (colon == std::string::npos || colon == 0)
            throw Error(fmt::format("--listen {}: expected tcp:HOST:PORT", text));
        spec.host = rest.substr(0, colon);
    }
    const std::string port = rest.substr(colon + 1);
    const std::optional<uint16_t> value = port_number(port);
    if (!value)
        throw Error(fmt::format("--listen {}: the port must be a number from 1 to 65535", text));
    spec.port = *value;
    return spec;
}

} // namespace agentvm
