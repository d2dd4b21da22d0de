#include "guest/agent/outbox.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <utility>

namespace agentvm {

Outbox::Outbox(int socket, std::function<void()> on_broken)
    : socket_(socket), on_broken_(std::move(on_broken)), writer_([this] { write_loop(); })
{
}

Outbox::~Outbox()
{
    flush_and_stop();
}

void Outbox::send(std::string line)
{
    std::lock_guard lock(mutex_);
    if (broken_ || stopping_)
        return;
    queued_bytes_ += line.size();
    queue_.push_back(std::move(line));
    changed_.notify_all();
}

void Outbox::send_paced(std::string line, size_t limit)
{
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return broken_ || stopping_ || queued_bytes_ <= limit; });
    if (broken_ || stopping_)
        return;
    queued_bytes_ += line.size();
    queue_.push_back(std::move(line));
    changed_.notify_all();
}

void Outbox::flush_and_stop()
{
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
        changed_.notify_all();
    }
    if (writer_.joinable())
        writer_.join();
}

void Outbox::write_loop()
{
    std::unique_lock lock(mutex_);
    for (;;) {
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty())
            return; // stopping and flushed
        std::string line = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();

        bool ok = true;
        for (size_t sent = 0; sent < line.size();) {
            const ssize_t n = ::send(socket_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                ok = false;
                break;
            }
            sent += static_cast<size_t>(n);
        }

        lock.lock();
        queued_bytes_ -= line.size();
        if (!ok) {
            broken_ = true;
            queued_bytes_ = 0;
            queue_.clear();
        }
        changed_.notify_all();
        if (!ok) {
            lock.unlock();
            on_broken_();
            lock.lock();
            // Nothing more can be sent; wait only for the stop request.
            changed_.wait(lock, [&] { return stopping_; });
            return;
        }
    }
}

} // namespace agentvm
