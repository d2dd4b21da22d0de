// Reads the agent's lines on the event loop and passes them on in pieces as they arrive,
// checking each with a ResponseScanner on the way: a response of hundreds of MiB costs the
// relay one read buffer, never the line. Short lines (the usual case) are held until they
// have been checked whole, so a line that turns out not to be JSON is never passed on; a
// longer one is passed on as it arrives, and should it break off (a guest gone wrong), what
// was passed on of it is ended with a newline, so the lines after it stay lines. Whether a
// line is passed on at all is the reader's choice, by its id (Handlers::wanted): a guest's
// line about a call nobody made goes nowhere.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "protocol/response_scanner.hpp"
#include "core/fd_reader.hpp"

namespace agentvm {

class ResponseStream {
public:
    // The longest line held back until it is checked whole.
    static constexpr size_t max_held_line = size_t{1} << 20;

    struct Handlers {
        std::function<void(std::string bytes)> on_bytes;  // the next bytes to pass on
        // Whether a line with this top-level id (nullopt: none, or not yet arrived) is passed
        // on: asked once per line, before its first byte goes to on_bytes. A line not wanted
        // is read and checked like any other, and dropped.
        std::function<bool(const std::optional<std::string>& id)> wanted;
        // Bytes of a wanted line whose top-level id has arrived; the line goes on.
        std::function<void(const std::string& id)> on_progress;
        // A wanted line ended; its last bytes (with its '\n') went to on_bytes.
        std::function<void(const ResponseSummary&)> on_line;
        // A line not wanted ended; none of it went to on_bytes.
        std::function<void(const ResponseSummary&)> on_dropped;
        // Not a JSON object, or longer than max_line; nothing more is read.
        std::function<void(const std::string& why)> on_bad_line;
        std::function<void(int err)> on_end;  // 0 at end-of-file, else errno
    };

    ResponseStream(EventLoop& loop, int fd, size_t max_line, Handlers handlers);
    ResponseStream(const ResponseStream&) = delete;
    ResponseStream& operator=(const ResponseStream&) = delete;

    void start() { reader_.start(); }
    // Backpressure: stop reading until resume() (bytes already read are still passed on).
    void pause() { reader_.pause(); }
    void resume() { reader_.resume(); }
    // Reads no more; a line partly passed on is ended with a newline first, so that what
    // is written after it starts a line of its own.
    void stop();

private:
    void on_bytes(std::string_view bytes);
    void on_end(int err);
    // Takes bytes up to the line's end (or all of them); false after a bad line.
    bool take(std::string_view bytes);
    bool end_line();
    void bad_line(const std::string& why);

    size_t max_line_;
    Handlers handlers_;
    ResponseScanner scanner_;
    std::string held_;        // the line so far, while it is short
    size_t line_bytes_ = 0;   // of the line so far
    bool passing_ = false;    // this line is too long to hold: its bytes go on as they come
    bool dropping_ = false;   // this line is not wanted: its bytes go nowhere
    bool line_started_ = false;
    FdReader reader_;
};

} // namespace agentvm
