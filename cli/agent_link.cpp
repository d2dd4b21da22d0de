#include "cli/agent_link.hpp"

#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace agentvm {
namespace {

// Short against a boot of tens of milliseconds; each refused try costs the guest one packet.
constexpr auto retry_interval = std::chrono::milliseconds(5);
// "OK 1073741824\n" and some slack; anything longer is not the handshake.
constexpr size_t max_handshake = 32;

} // namespace

AgentLink::AgentLink(Vm& vm, std::chrono::milliseconds deadline, Connected on_connected,
                     Failed on_failed)
    : vm_(vm), deadline_(deadline), on_connected_(std::move(on_connected)),
      on_failed_(std::move(on_failed)), retry_(vm.event_loop(), [this] { attempt(); }),
      give_up_(vm.event_loop(), [this] {
          if (done_)
              return;
          cancel();
          on_failed_(fmt::format("the guest agent did not answer on vsock port {} within {} s "
                                 "({} tries); see the guest console (--console) for why",
                                 agent_vsock_port, std::chrono::duration<double>(deadline_).count(), attempts_));
      })
{
}

void AgentLink::start()
{
    give_up_.arm(deadline_);
    attempt();
}

void AgentLink::cancel()
{
    done_ = true;
    retry_.cancel();
    give_up_.cancel();
    if (socket_) {
        vm_.event_loop().unwatch(socket_.get());
        socket_.reset();
    }
}

void AgentLink::attempt()
{
    if (done_)
        return;
    ++attempts_;
    handshake_.clear();
    socket_ = vm_.connect_vsock(agent_vsock_port);
    vm_.event_loop().watch_readable(socket_.get(), [this] { read_handshake(); });
}

void AgentLink::read_handshake()
{
    // One byte at a time: nothing may be read past the handshake's newline. The agent never
    // speaks first, so in practice the line is all there is.
    char byte = 0;
    ssize_t n = 0;
    while ((n = ::read(socket_.get(), &byte, 1)) == 1 && byte != '\n') {
        if (handshake_.size() == max_handshake)
            break;
        handshake_.push_back(byte);
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    vm_.event_loop().unwatch(socket_.get());
    if (n == 1 && byte == '\n' && handshake_.starts_with("OK ")) {
        spdlog::debug("agent reachable after {} tries", attempts_);
        done_ = true;
        retry_.cancel();
        give_up_.cancel();
        on_connected_(std::move(socket_));
        return;
    }
    // Refused (end-of-file): the guest is not listening yet.
    socket_.reset();
    retry_.arm(retry_interval);
}

} // namespace agentvm
