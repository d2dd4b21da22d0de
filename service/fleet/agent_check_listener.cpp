#include "service/fleet/agent_check_listener.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

namespace agentvm {
namespace {

// How long the listener rests when accept runs out of descriptors.
constexpr auto out_of_fds_rest = std::chrono::milliseconds(250);
// What is read and thrown away of a client's bytes (HAProxy's agent-send, or garbage) before
// the close: unread bytes would make the close a reset, which may cost the client the line.
constexpr size_t discard_max = 1024;

} // namespace

AgentCheckListener::AgentCheckListener(EventLoop& loop, Fd listener, std::function<std::string()> line)
    : loop_(loop), listener_(std::move(listener)), line_(std::move(line)), resume_(loop, [this] {
          loop_.watch_readable(listener_.get(), [this] { on_readable(); });
          watching_ = true;
      })
{
    loop_.watch_readable(listener_.get(), [this] { on_readable(); });
    watching_ = true;
}

AgentCheckListener::~AgentCheckListener()
{
    if (watching_)
        loop_.unwatch(listener_.get());
}

void AgentCheckListener::on_readable()
{
    // Bounded work per wake: a flood of connections waits in the backlog (and is dropped by
    // the kernel past it) while the loop serves everything else between two wakes.
    for (unsigned i = 0; i < max_accepts_per_wake; ++i) {
        Fd connection(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (connection) {
            answer(connection.get());
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == EPERM)
            continue;  // that one client's trouble
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            spdlog::warn("--agent-check: accept: {}; resting {} ms", strerror(errno), out_of_fds_rest.count());
            loop_.unwatch(listener_.get());
            watching_ = false;
            resume_.arm(out_of_fds_rest);
        }
        return;  // EAGAIN: nothing left to accept
    }
}

void AgentCheckListener::answer(int connection)
{
    std::string line;
    try {
        line = line_();
    } catch (const std::exception& e) {
        // Closed without a word: HAProxy takes an agent that says nothing as no news.
        spdlog::warn("--agent-check: no report: {}", e.what());
        return;
    }
    // A fresh connection's send buffer takes a line of a few dozen bytes whole; a client that
    // does not read simply never sees it.
    if (::send(connection, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(line.size()))
        ++answered_;
    char discard[256];
    for (size_t read = 0; read < discard_max;) {
        const ssize_t got = ::recv(connection, discard, sizeof discard, MSG_DONTWAIT);
        if (got <= 0)
            break;
        read += static_cast<size_t>(got);
    }
    ::shutdown(connection, SHUT_WR);
}

} // namespace agentvm
