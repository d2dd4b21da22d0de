// A file written into a sandbox as its bytes come, whatever brings them (a native upload's
// body, a multipart part): the bytes go to the guest in write_file chunks of 4 MiB, at most
// two in flight; past that the writer has no room and says when it has again, so the source
// can wait (backpressure) and the file is never held whole. One writer per path at a time
// (Sandbox::claim_upload), and one history entry for the whole file.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "service/problem.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

class FileWriter : public std::enable_shared_from_this<FileWriter> {
public:
    struct Handlers {
        // There is room again after has_room() said no.
        std::function<void()> on_room;
        // Once: {"ok":true,"path","bytes"}, or the agent's {"error":{code,message}} (the
        // sandbox ended: vm_died). Not after abandon().
        std::function<void(Json&& outcome)> on_done;
    };

    // A writer of `path` (with `mode` for a new file; as `user`, the agent's "user", when
    // given), or the refusal when another writer of the same path is still at work in this
    // sandbox.
    static std::shared_ptr<FileWriter> open(const std::shared_ptr<Sandbox>& sandbox, std::string path,
                                            std::optional<std::string> mode, Handlers handlers,
                                            std::optional<Refusal>& refusal,
                                            std::optional<std::string> user = std::nullopt);
    ~FileWriter();
    FileWriter(const FileWriter&) = delete;
    FileWriter& operator=(const FileWriter&) = delete;

    void write(std::string_view bytes);
    bool has_room() const;
    // The bytes have ended: the rest goes out, then on_done.
    void close();
    // The source went away: nothing more is sent, and the history entry says why.
    void abandon(const std::string& why);

    FileWriter(std::weak_ptr<Sandbox> sandbox, std::string path, std::optional<std::string> mode,
               std::optional<std::string> user, Handlers handlers);

private:
    void send(size_t bytes);
    void answered(const Json& answer);
    void fail(Json answer);
    void finish_if_done();

    std::weak_ptr<Sandbox> sandbox_;  // weak: its pending calls hold this writer
    std::string path_;
    std::optional<std::string> mode_;
    std::optional<std::string> user_;
    Handlers handlers_;
    std::string buffer_;
    uint64_t seq_ = 0;
    uint64_t total_ = 0;
    unsigned in_flight_ = 0;
    bool sent_any_ = false;
    bool closed_ = false;
    bool over_ = false;  // done, failed or abandoned
};

} // namespace agentvm
