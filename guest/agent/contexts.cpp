#include "guest/agent/contexts.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <variant>

#include "guest/agent/interpreter.hpp"
#include "guest/agent/shell.hpp"

namespace agentvm {

namespace {

constexpr char default_python_name[] = "default";
constexpr char default_bash_name[] = "default-bash";

std::string current_dir()
{
    char dir[PATH_MAX];
    return ::getcwd(dir, sizeof(dir)) ? dir : "/";
}

// A bash cell's answer in run_code's shape, made from the shell call's (exec's shape): a
// non-zero status is the cell's exception, as an error is a Python cell's.
Json bash_cell_response(Json ran, bool state_lost)
{
    const Json exit_code = ran.value("exit_code", Json());
    const Json signal = ran.value("signal", Json());
    Json exception = nullptr;
    if (state_lost)
        exception = Json{{"type", "InterpreterDied"},
                         {"message", signal.is_null() ? "the shell exited with status " + exit_code.dump()
                                                      : "the shell was killed by signal " + signal.dump()},
                         {"traceback", nullptr}};
    else if (exit_code != 0)
        exception = Json{{"type", "ExitCode"}, {"message", "exit code " + exit_code.dump()}, {"traceback", nullptr}};
    Json response{{"id", ran["id"]},
                  {"result", nullptr},
                  {"result_truncated", false},
                  {"formats", Json::object()},
                  {"formats_truncated", Json::array()},
                  {"exception", std::move(exception)},
                  {"exit_code", exit_code},
                  {"timed_out", ran["timed_out"]},
                  {"state_lost", state_lost}};
    for (const char* field : {"cancelled", "shell", "stdout", "stdout_b64", "stdout_truncated", "stderr", "stderr_b64",
                              "stderr_truncated", "duration_ms"})
        if (const auto it = ran.find(field); it != ran.end())
            response[field] = std::move(*it);
    return response;
}

} // namespace

struct InterpreterContext {
    using Engine = std::variant<Interpreter, Shell>;

    InterpreterContext(std::string name_, CodeLanguage language_, std::string cwd_, std::optional<std::string> start_in)
        : name(std::move(name_)), language(language_), cwd(std::move(cwd_)),
          engine(make_engine(language_, std::move(start_in)))
    {
    }

    static Engine make_engine(CodeLanguage language, std::optional<std::string> start_in)
    {
        if (language == CodeLanguage::bash)
            return Engine(std::in_place_type<Shell>, std::move(start_in));
        return Engine(std::in_place_type<Interpreter>, std::move(start_in));
    }

    bool is_default() const { return name == default_python_name || name == default_bash_name; }
    // Ends the process from any thread, also under a running cell.
    void kill() const
    {
        std::visit([](const auto& process) { process.kill_on_exit(); }, engine);
    }
    // Not while a cell runs.
    void stop()
    {
        std::visit([](auto& process) { process.stop(); }, engine);
    }
    bool running()
    {
        return std::visit([](auto& process) { return process.running(); }, engine);
    }
    // Its process's pid while it runs, else -1; from any thread.
    pid_t pid() const
    {
        return std::visit([](const auto& process) { return process.pid(); }, engine);
    }

    const std::string name;
    const CodeLanguage language;
    const std::string cwd;  // where its process starts, as listed
    Turns turns;
    std::mutex mutex;  // guards the members below, and the engine while no cell runs
    Engine engine;
    // Raised by each restart and by the removal: a cell read before it does not run.
    uint64_t epoch = 0;
    bool busy = false;  // a cell has the engine
    bool removed = false;
    // "restarted" or "removed" when that ended the process under the running cell.
    std::string ended_by;
};

Contexts::Contexts() : agent_cwd_(current_dir())
{
    contexts_.push_back(
        std::make_shared<InterpreterContext>(default_python_name, CodeLanguage::python, agent_cwd_, std::nullopt));
}

Contexts::Cell::Cell(Contexts& contexts, std::shared_ptr<InterpreterContext> context, uint64_t epoch)
    : contexts_(&contexts), context_(std::move(context)), epoch_(epoch)
{
}

Turns& Contexts::Cell::turns()
{
    return context_->turns;
}

Json Contexts::Cell::not_run(const Json& id) const
{
    Json response = Interpreter::not_run(id);
    if (context_->language == CodeLanguage::bash)
        response["exit_code"] = nullptr;
    return response;
}

Json Contexts::Cell::run(const Json& id, const RunCodeRequest& request, Outbox& outbox, int cancel_fd)
{
    InterpreterContext& context = *context_;
    {
        std::lock_guard lock(context.mutex);
        if (context.removed)
            throw CallError("not_found", "context \"" + context.name + "\" was removed before this cell's turn");
        if (context.epoch != epoch_)
            return not_run(id);
        context.busy = true;
        context.ended_by.clear();
    }
    // However the cell ends, the engine is free again; the process of a context removed
    // meanwhile (one this cell may have started after the removal's kill) goes for good.
    struct Release {
        Cell& cell;
        ~Release()
        {
            bool removed = false;
            {
                std::lock_guard lock(cell.context_->mutex);
                cell.context_->busy = false;
                removed = cell.context_->removed;
                if (removed)
                    cell.context_->stop();
            }
            if (removed)
                cell.contexts_->retired(cell.context_);
        }
    } release{*this};

    Json response;
    if (context.language == CodeLanguage::python) {
        response = std::get<Interpreter>(context.engine).run(id, request, outbox, cancel_fd);
    } else {
        Shell& shell = std::get<Shell>(context.engine);
        ShellRequest call;
        call.cmd = request.code;
        call.timeout_s = request.timeout_s;
        call.max_output = request.max_output;
        call.stream = request.stream;
        call.output_in_response = request.output_in_response;
        Json ran = shell.run(id, call, outbox, cancel_fd, request.env);
        response = bash_cell_response(std::move(ran), !shell.running());
    }
    std::lock_guard lock(context.mutex);
    if (!context.ended_by.empty() && response["state_lost"] == true && response["exception"].is_object())
        response["exception"]["message"] =
            response["exception"].value("message", std::string()) + " (the context was " + context.ended_by + ")";
    return response;
}

std::shared_ptr<InterpreterContext> Contexts::find(const std::string& name) const
{
    const auto it = std::find_if(contexts_.begin(), contexts_.end(), [&](const auto& c) { return c->name == name; });
    return it == contexts_.end() ? nullptr : *it;
}

std::shared_ptr<InterpreterContext> Contexts::default_bash()
{
    if (std::shared_ptr<InterpreterContext> existing = find(default_bash_name))
        return existing;
    auto made = std::make_shared<InterpreterContext>(default_bash_name, CodeLanguage::bash, agent_cwd_, std::nullopt);
    contexts_.push_back(made);
    return made;
}

Contexts::Cell Contexts::cell_for(const RunCodeRequest& request)
{
    std::shared_ptr<InterpreterContext> context;
    {
        std::lock_guard lock(mutex_);
        if (!request.context)
            context = request.language == CodeLanguage::bash ? default_bash() : find(default_python_name);
        else if (*request.context == default_bash_name)
            context = default_bash();
        else
            context = find(*request.context);
    }
    if (!context)
        throw CallError("not_found", "no context \"" + *request.context + "\"");
    if (request.language && *request.language != context->language)
        throw CallError("bad_field", "\"language\" is \"" + std::string(language_name(*request.language))
                                         + "\" but context \"" + context->name + "\" is "
                                         + std::string(language_name(context->language)));
    // A Python cell sets os.environ, which takes any name; a shell exports only its own kind.
    // Refused now rather than at the cell's turn.
    if (context->language == CodeLanguage::bash)
        Shell::check_env(request.env);
    std::lock_guard lock(context->mutex);
    return Cell(*this, context, context->epoch);
}

std::optional<Json> Contexts::answer(const Json& id, const decltype(Request::op)& op)
{
    if (const auto* made = std::get_if<CreateContextRequest>(&op))
        return create(id, *made);
    if (std::holds_alternative<ListContextsRequest>(op))
        return list(id);
    if (const auto* restarted = std::get_if<RestartContextRequest>(&op))
        restart(restarted->context);
    else if (const auto* removed = std::get_if<RemoveContextRequest>(&op))
        remove(removed->context);
    else
        return std::nullopt;
    return Json{{"id", id}, {"ok", true}};
}

Json Contexts::create(const Json& id, const CreateContextRequest& request)
{
    std::string cwd = agent_cwd_;
    if (request.cwd) {
        // Relative to the agent's, as an exec call's cwd; listed as the absolute path.
        cwd = request.cwd->front() == '/' ? *request.cwd
                                          : agent_cwd_ + (agent_cwd_.ends_with('/') ? "" : "/") + *request.cwd;
        struct stat st {};
        if (::stat(cwd.c_str(), &st) != 0) {
            const int error = errno;
            throw CallError(error == ENOENT || error == ENOTDIR ? "not_found" : "io",
                            "cwd " + cwd + ": " + std::strerror(error));
        }
        if (!S_ISDIR(st.st_mode))
            throw CallError("not_found", "cwd " + cwd + ": " + std::strerror(ENOTDIR));
    }
    std::lock_guard lock(mutex_);
    const auto made = std::count_if(contexts_.begin(), contexts_.end(), [](const auto& c) { return !c->is_default(); });
    if (static_cast<size_t>(made) >= max_contexts)
        throw CallError("limit", "at most " + std::to_string(max_contexts) + " contexts besides \""
                                     + default_python_name + "\" and \"" + default_bash_name + "\"; remove one first");
    const std::string name = "ctx-" + std::to_string(++created_);
    auto context = std::make_shared<InterpreterContext>(name, request.language, cwd, cwd);
    contexts_.push_back(context);
    return Json{{"id", id},
                {"ok", true},
                {"context", context->name},
                {"language", std::string(language_name(context->language))},
                {"cwd", context->cwd}};
}

Json Contexts::list(const Json& id)
{
    Json listed = Json::array();
    std::lock_guard lock(mutex_);
    for (const std::shared_ptr<InterpreterContext>& context : contexts_) {
        bool running = false;
        {
            std::lock_guard context_lock(context->mutex);
            running = context->busy || context->running();
        }
        listed.push_back(Json{{"context", context->name},
                              {"language", std::string(language_name(context->language))},
                              {"cwd", context->cwd},
                              {"running", running}});
    }
    return Json{{"id", id}, {"ok", true}, {"contexts", std::move(listed)}};
}

void Contexts::restart(const std::string& name)
{
    std::shared_ptr<InterpreterContext> context;
    {
        std::lock_guard lock(mutex_);
        context = find(name);
    }
    if (!context)
        throw CallError("not_found", "no context \"" + name + "\"");
    std::lock_guard lock(context->mutex);
    ++context->epoch;
    if (context->busy) {
        context->ended_by = "restarted";
        context->kill();
    } else {
        context->stop();
    }
}

void Contexts::remove(const std::string& name)
{
    if (name == default_python_name)
        throw CallError("bad_field", "\"context\" \"default\" cannot be removed (restart_context empties it)");
    std::lock_guard lock(mutex_);
    const auto it = std::find_if(contexts_.begin(), contexts_.end(), [&](const auto& c) { return c->name == name; });
    if (it == contexts_.end())
        throw CallError("not_found", "no context \"" + name + "\"");
    std::shared_ptr<InterpreterContext> context = *it;
    contexts_.erase(it);
    std::lock_guard context_lock(context->mutex);
    context->removed = true;
    ++context->epoch;
    if (context->busy) {
        context->ended_by = "removed";
        context->kill();
        retiring_.push_back(context);
    } else {
        context->stop();
    }
}

void Contexts::retired(const std::shared_ptr<InterpreterContext>& context)
{
    std::lock_guard lock(mutex_);
    std::erase(retiring_, context);
}

void Contexts::describe_processes(Json& entries) const
{
    std::lock_guard lock(mutex_);
    for (const std::shared_ptr<InterpreterContext>& context : contexts_)
        if (const pid_t pid = context->pid(); pid > 0)
            entries.push_back(Json{{"pid", pid},
                                   {"tag", nullptr},
                                   {"kind", "context"},
                                   {"context", context->name},
                                   {"language", context->language == CodeLanguage::bash ? "bash" : "python"},
                                   {"cwd", context->cwd},
                                   {"running", true}});
}

bool Contexts::signal(pid_t pid, int signal, bool group) const
{
    std::lock_guard lock(mutex_);
    for (const std::shared_ptr<InterpreterContext>& context : contexts_)
        if (context->pid() == pid) {
            ::kill(group ? -pid : pid, signal);
            return true;
        }
    return false;
}

void Contexts::kill_on_exit() const
{
    std::lock_guard lock(mutex_);
    for (const auto* contexts : {&contexts_, &retiring_})
        for (const std::shared_ptr<InterpreterContext>& context : *contexts)
            context->kill();
}

} // namespace agentvm
