#include "episode/line_reader.hpp"

#include <utility>

namespace agentvm {

LineReader::LineReader(EventLoop& loop, int fd, size_t max_line, Handlers handlers)
    : handlers_(std::move(handlers)),
      framer_(max_line, [this](std::string&& line) { handlers_.on_line(std::move(line)); },
              [this] { handlers_.on_too_long(); }),
      reader_(loop, fd,
              {[this](std::string_view bytes) { on_bytes(bytes); }, [this](int err) { on_end(err); }})
{
}

void LineReader::on_bytes(std::string_view bytes)
{
    framer_.feed(bytes);
    if (on_partial_ && !reader_.ended() && !framer_.partial().empty())
        on_partial_(framer_.partial());
}

void LineReader::on_end(int err)
{
    framer_.finish();
    handlers_.on_end(err);
}

} // namespace agentvm
