// run_code's interpreter contexts (docs/protocol.md, run_code and create_context): each is one
// persistent interpreter, python3 through the driver (Interpreter) or bash (Shell), started at
// its first cell, with the turns its cells take. Cells of one context run one at a time in
// request order; cells of different contexts run at once. "default" (Python) always exists,
// "default-bash" once a cell asks for it, and at most max_contexts others that create_context
// makes. Like the shell, contexts belong to the agent, not to a connection.
//
// The ops that manage them (create, list, restart, remove) are answered on a connection's
// reading thread while cells run on threads of their own, so a context's engine is touched by
// one thread at a time: its cell's while one runs (`busy`), else under the context's mutex. A
// restart or a removal during a cell only kills the cell's process (a signal, from any thread);
// the cell's thread then finds it dead and cleans up, as after a timeout.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "guest/agent/outbox.hpp"
#include "guest/agent/turns.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

struct InterpreterContext;

class Contexts {
public:
    // Besides "default" and "default-bash".
    static constexpr size_t max_contexts = 16;

    Contexts();
    Contexts(const Contexts&) = delete;
    Contexts& operator=(const Contexts&) = delete;

    // A run_code call bound, when it was read, to its context: it runs there when its turn
    // comes, unless the context was restarted (it then answers as cancelled without running) or
    // removed (not_found) in between.
    class Cell {
    public:
        Turns& turns();
        // The final response. Throws CallError (not_found, spawn_failed).
        Json run(const Json& id, const RunCodeRequest& request, Outbox& outbox, int cancel_fd);
        // The response of a cell that does not run.
        Json not_run(const Json& id) const;

    private:
        friend class Contexts;
        Cell(Contexts& contexts, std::shared_ptr<InterpreterContext> context, uint64_t epoch);

        Contexts* contexts_;
        std::shared_ptr<InterpreterContext> context_;
        uint64_t epoch_;
    };

    // The context `request` names, or its language's default. Throws CallError: not_found (no
    // such context), bad_field (its language is not the request's; a bash cell's env name the shell
    // cannot export).
    Cell cell_for(const RunCodeRequest& request);

    // The answer to a context op, nullopt for any other op. Throws CallError (not_found,
    // bad_field, limit, io).
    std::optional<Json> answer(const Json& id, const decltype(Request::op)& op);

    // From any thread, as the agent exits: no context's process outlives it.
    void kill_on_exit() const;
    // list_processes' entries of the contexts' running processes (kind "context").
    void describe_processes(Json& entries) const;
    // Signals the running process of the context whose pid is `pid` (its group with `group`);
    // false when no context's process has that pid.
    bool signal(pid_t pid, int signal, bool group) const;

private:
    Json create(const Json& id, const CreateContextRequest& request);
    Json list(const Json& id);
    void restart(const std::string& name);
    void remove(const std::string& name);
    // Under mutex_: the named context, null when there is none.
    std::shared_ptr<InterpreterContext> find(const std::string& name) const;
    // Under mutex_: "default-bash", made when first asked for.
    std::shared_ptr<InterpreterContext> default_bash();
    // A cell of a removed context has ended: its process is gone for good.
    void retired(const std::shared_ptr<InterpreterContext>& context);

    const std::string agent_cwd_;
    mutable std::mutex mutex_;  // guards the members below
    std::vector<std::shared_ptr<InterpreterContext>> contexts_;  // "default" first, then in creation order
    // Removed while a cell ran: kept for kill_on_exit until that cell has ended.
    std::vector<std::shared_ptr<InterpreterContext>> retiring_;
    uint64_t created_ = 0;  // numbers the "ctx-N" names, never reused
};

} // namespace agentvm
