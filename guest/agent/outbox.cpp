#include "guest/agent/outbox.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <utility>

namespace agentvm {
namespace {

// What send_message encodes and sends at a time.
constexpr size_t message_piece = size_t{1} << 20;

} // namespace

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

void Outbox::send_message(Json message)
{
    std::lock_guard lock(mutex_);
    if (broken_ || stopping_)
        return;
    queue_.push_back(std::move(message));
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

bool Outbox::send_all(std::string_view bytes)
{
    while (!bytes.empty()) {
        const ssize_t n = ::send(socket_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
}

void Outbox::write_loop()
{
    std::unique_lock lock(mutex_);
    for (;;) {
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty())
            return; // stopping and flushed
        auto entry = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();

        bool ok = true;
        size_t counted = 0;
        if (auto* line = std::get_if<std::string>(&entry)) {
            ok = send_all(*line);
            counted = line->size();
        } else {
            ok = write_line(std::get<Json>(entry), message_piece, [this](std::string_view piece) {
                return send_all(piece);
            });
        }

        lock.lock();
        queued_bytes_ -= counted;
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
