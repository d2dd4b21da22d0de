#include "service/ports/guest_ports.hpp"

#include <fmt/format.h>

#include "service/ports/byte_tunnel.hpp"
#include "service/ports/guest_port_dialer.hpp"
#include "service/ports/port_http_relay.hpp"
#include "service/problem.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

namespace {

// Served by serve itself (the E2B facade's envd and code interpreter), never a guest's.
constexpr uint16_t e2b_envd_port = 49983;
constexpr uint16_t e2b_interpreter_port = 49999;

// A raw stream to a guest port, once the guest's relay has connected it: the client's
// connection is switched to it (101) and the two are joined.
struct TcpRelay {
    std::shared_ptr<GuestPortDialer> dialer;
    std::shared_ptr<ByteTunnel> tunnel;
};

} // namespace

GuestPorts::GuestPorts(EventLoop& loop) : loop_(loop), poller_(loop) {}

GuestPorts::~GuestPorts()
{
    while (!open_.empty()) {
        auto close = std::move(open_.begin()->second.close);
        const uint64_t key = open_.begin()->first;
        if (close)
            close();
        remove(key);
    }
}

uint16_t GuestPorts::port_number(const std::string& text)
{
    if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos
        || text.front() == '0' || std::stoul(text) > 65535)
        throw RefusedRequest(ServiceError::bad_field,
                             fmt::format("'{:.16}' is not a port: a guest port is a number from 1 to 65535", text));
    const auto port = static_cast<uint16_t>(std::stoul(text));
    if (port == e2b_envd_port || port == e2b_interpreter_port)
        throw RefusedRequest(ServiceError::bad_field,
                             fmt::format("port {} is not forwarded: serve answers it itself (E2B's {})", port,
                                         port == e2b_envd_port ? "envd" : "code interpreter"));
    return port;
}

bool GuestPorts::admit(const std::shared_ptr<HttpExchange>& exchange, const Sandbox& sandbox)
{
    const auto found = per_sandbox_.find(sandbox.id());
    if (found == per_sandbox_.end() || found->second < max_per_sandbox)
        return true;
    ++refused_;
    exchange->refuse(Refusal{ServiceError::at_capacity,
                             fmt::format("sandbox {} has {} connections to its ports open, as many as it may",
                                         sandbox.id(), max_per_sandbox),
                             1});
    return false;
}

uint64_t GuestPorts::add(const std::string& sandbox_id)
{
    const uint64_t key = next_key_++;
    open_[key].sandbox_id = sandbox_id;
    ++per_sandbox_[sandbox_id];
    ++total_;
    return key;
}

void GuestPorts::remove(uint64_t key)
{
    const auto found = open_.find(key);
    if (found == open_.end())
        return;
    const auto count = per_sandbox_.find(found->second.sandbox_id);
    if (count != per_sandbox_.end() && --count->second == 0)
        per_sandbox_.erase(count);
    // Dropped last: this may be the connection's own last reference, and it may be running.
    std::shared_ptr<void> keep = std::move(found->second.keep);
    open_.erase(found);
}

void GuestPorts::relay_http(const std::shared_ptr<HttpExchange>& exchange, Sandbox& sandbox, uint16_t port,
                            std::string path_and_query, std::vector<std::string> strip)
{
    if (!admit(exchange, sandbox))
        return;
    const uint64_t key = add(sandbox.id());
    PortHttpRelay::Target target{sandbox.id(), sandbox.guest_socket(), port, std::move(path_and_query),
                                 std::move(strip)};
    auto relay = PortHttpRelay::start(loop_, poller_, exchange, std::move(target), [this, key] { remove(key); });
    if (auto found = open_.find(key); found != open_.end()) {
        std::weak_ptr<PortHttpRelay> weak = relay;
        found->second.keep = relay;
        found->second.close = [weak] {
            if (auto open = weak.lock())
                open->close();
        };
    }
}

void GuestPorts::relay_tcp(const std::shared_ptr<HttpExchange>& exchange, Sandbox& sandbox, uint16_t port)
{
    if (!admit(exchange, sandbox))
        return;
    const uint64_t key = add(sandbox.id());
    auto relay = std::make_shared<TcpRelay>();
    std::weak_ptr<TcpRelay> weak = relay;
    open_[key].keep = relay;
    open_[key].close = [this, weak, key] {
        if (auto open = weak.lock()) {
            if (open->dialer)
                open->dialer->cancel();
            if (open->tunnel)
                open->tunnel->close();
        }
        remove(key);
    };
    const std::string id = sandbox.id();
    exchange->watch_client();
    exchange->on_gone([this, weak, key] {
        if (auto open = weak.lock(); open && open->dialer && !open->tunnel)
            open->dialer->cancel();
        if (auto open = weak.lock(); !open || !open->tunnel)
            remove(key);
    });
    relay->dialer = GuestPortDialer::dial(
        loop_, poller_, sandbox.guest_socket(), port,
        {[this, weak, exchange, key](DialedPort dialed) {
             auto open = weak.lock();
             if (!open)
                 return;
             open->dialer.reset();
             exchange->add_header("Upgrade", raw_tcp_upgrade);
             auto guest = std::make_shared<DialedPort>(std::move(dialed));
             exchange->upgrade([this, weak, guest, key](HttpExchange::UpgradedSocket client) -> std::function<void()> {
                 auto still = weak.lock();
                 if (!still)
                     return nullptr;
                 still->tunnel = ByteTunnel::join(poller_, {client.fd, std::move(client.close)},
                                                  std::move(client.early), std::move(guest->socket),
                                                  std::move(guest->early), [this, key] { remove(key); });
                 std::weak_ptr<ByteTunnel> tunnel = still->tunnel;
                 return [tunnel] {
                     if (auto joined = tunnel.lock())
                         joined->close();
                 };
             });
         },
         [this, exchange, id, key](const std::string& why, bool) {
             exchange->refuse(ServiceError::port_unreachable, fmt::format("sandbox {}: {}", id, why));
             remove(key);
         }});
}

} // namespace agentvm
