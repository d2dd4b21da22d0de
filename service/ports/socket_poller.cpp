#include "service/ports/socket_poller.hpp"

#include <sys/epoll.h>

#include <array>
#include <cerrno>

#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

SocketPoller::SocketPoller(EventLoop& loop) : loop_(loop), epoll_(::epoll_create1(EPOLL_CLOEXEC))
{
    if (!epoll_)
        throw_errno("epoll_create1 for the guest-port connections");
    loop_.watch_readable(epoll_.get(), [this] { dispatch(); });
}

SocketPoller::~SocketPoller()
{
    loop_.unwatch(epoll_.get());
}

void SocketPoller::add(int fd, OnReady on_ready)
{
    epoll_event event{};
    event.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    event.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0)
        throw_errno("epoll_ctl ADD (a guest-port connection)");
    watched_[fd] = std::make_shared<OnReady>(std::move(on_ready));
}

void SocketPoller::remove(int fd)
{
    if (watched_.erase(fd) > 0)
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

void SocketPoller::again(int fd)
{
    // Modifying an edge-triggered registration re-checks readiness and reports it anew.
    epoll_event event{};
    event.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    event.data.fd = fd;
    if (watched_.contains(fd))
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &event);
}

void SocketPoller::dispatch()
{
    std::array<epoll_event, 64> events{};
    for (;;) {
        const int count = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), 0);
        if (count <= 0)
            return;
        for (int i = 0; i < count; ++i) {
            // Looked up again for each event: an earlier callback of this batch may have
            // removed (and closed, and even reused) this fd.
            const auto found = watched_.find(events[static_cast<size_t>(i)].data.fd);
            if (found == watched_.end())
                continue;
            const std::shared_ptr<OnReady> on_ready = found->second;
            try {
                (*on_ready)(events[static_cast<size_t>(i)].events);
            } catch (const std::exception& e) {
                // One connection's failure is its own; thrown on, it would end serve.
                spdlog::error("guest ports: {}", e.what());
            }
        }
        if (count < static_cast<int>(events.size()))
            return;
    }
}

} // namespace agentvm
