#include "guest/agent/attach.hpp"

#include <poll.h>

#include <chrono>

namespace agentvm {
namespace {

// How often a waiting attachment looks at its cancel: output and the end wake it at once.
constexpr std::chrono::milliseconds cancel_check{100};
// Output taken from the process per event batch.
constexpr size_t batch_bytes = size_t{256} << 10;

bool is_cancelled(int eventfd)
{
    pollfd pfd{eventfd, POLLIN, 0};
    return ::poll(&pfd, 1, 0) > 0;
}

// Holds one of the process's attachments while the call runs.
class Attachment {
public:
    explicit Attachment(std::shared_ptr<Process> process) : process_(std::move(process)) { process_->attach(); }
    ~Attachment() { process_->detach(); }
    Attachment(const Attachment&) = delete;
    Attachment& operator=(const Attachment&) = delete;
    Process& operator*() const { return *process_; }

private:
    std::shared_ptr<Process> process_;
};

} // namespace

Json attach_process(const Json& id, const AttachRequest& request, ProcessTable& processes, Outbox& outbox,
                    int cancel_fd)
{
    const Attachment attachment(processes.find(request.process));
    Process& process = *attachment;
    uint64_t cursor = request.replay ? process.output_start() : process.output_end();
    outbox.send(to_line(Json{{"id", id}, {"event", "attached"}, {"pid", process.pid()}}));
    for (;;) {
        if (is_cancelled(cancel_fd))
            return Json{{"id", id}, {"pid", process.pid()}, {"detached", true}, {"cancelled", true}};
        Process::Update update = process.next(cursor, batch_bytes, cancel_check);
        if (update.lost > 0)
            outbox.send_paced(to_line(Json{{"id", id}, {"event", "lost"}, {"bytes", update.lost}}), attach_queue_limit);
        for (OutputChunk& chunk : update.chunks) {
            Json event{{"id", id}, {"event", chunk.stream}};
            put_bytes(event, "data", std::move(chunk.data));
            outbox.send_paced(to_line(event), attach_queue_limit);
        }
        if (update.end) {
            const ProcessEnd& end = *update.end;
            return Json{{"id", id},
                        {"pid", process.pid()},
                        {"exit_code", end.exit_code ? Json(*end.exit_code) : Json(nullptr)},
                        {"signal", end.signal ? Json(*end.signal) : Json(nullptr)},
                        {"timed_out", end.timed_out},
                        {"oom_killed", end.oom_killed},
                        {"duration_ms", end.duration_ms}};
        }
    }
}

} // namespace agentvm
