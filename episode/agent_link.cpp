#include "episode/agent_link.hpp"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "protocol/agent_protocol.hpp"
#include "common/error.hpp"

namespace agentvm {
namespace {

// Short against a boot of tens of milliseconds; each refused try costs the guest one packet.
constexpr auto retry_interval = std::chrono::milliseconds(5);
// "OK 1073741824\n" and some slack; anything longer is not the handshake.
constexpr size_t max_handshake = 32;
// {"id":"agentvm-resume","ok":true}, or an error with its message.
constexpr size_t max_resume_answer = 4096;

} // namespace

AgentLink::AgentLink(Vm& vm, std::chrono::milliseconds deadline, bool resume, Connected on_connected,
                     Failed on_failed)
    : vm_(vm), deadline_(deadline), resume_(resume), on_connected_(std::move(on_connected)),
      on_failed_(std::move(on_failed)), retry_(vm.event_loop(), [this] { attempt(); }),
      give_up_(vm.event_loop(), [this] {
          if (done_)
              return;
          cancel();
          on_failed_(fmt::format("the guest agent did not answer on vsock port {} within {} s "
                                 "({} tries); see the guest console (--console) for why",
                                 agent_vsock_port, std::chrono::duration<double>(deadline_).count(), attempts_));
      })
{
}

void AgentLink::start()
{
    give_up_.arm(deadline_);
    attempt();
}

void AgentLink::cancel()
{
    done_ = true;
    retry_.cancel();
    give_up_.cancel();
    if (socket_) {
        vm_.event_loop().unwatch(socket_.get());
        socket_.reset();
    }
}

void AgentLink::attempt()
{
    if (done_)
        return;
    ++attempts_;
    // A booting guest refuses for a while: its retries are noise except when tracing.
    spdlog::log(attempts_ == 1 ? spdlog::level::debug : spdlog::level::trace, "connecting to the agent (try {})",
                attempts_);
    line_.clear();
    socket_ = vm_.connect_vsock(agent_vsock_port);
    vm_.event_loop().watch_readable(socket_.get(), [this] { read_handshake(); });
}

AgentLink::LineRead AgentLink::read_line(size_t max)
{
    // One byte at a time: nothing may be read past the newline, which ends what the link
    // owns of the stream. The agent never speaks first, so in practice the line is all there is.
    char byte = 0;
    ssize_t n = 0;
    while ((n = ::read(socket_.get(), &byte, 1)) == 1 && byte != '\n' && line_.size() < max)
        line_.push_back(byte);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return LineRead::more;
    vm_.event_loop().unwatch(socket_.get());
    if (n == 1 && byte == '\n')
        return LineRead::line;
    return n == 0 && line_.empty() ? LineRead::closed : LineRead::garbled;
}

void AgentLink::read_handshake()
{
    const LineRead read = read_line(max_handshake);
    if (read == LineRead::more)
        return;
    if (read == LineRead::line && line_.starts_with("OK ")) {
        spdlog::debug("agent reachable after {} tries", attempts_);
        if (resume_)
            send_resume();
        else
            connected();
        return;
    }
    // Refused (end-of-file): the guest is not listening yet.
    socket_.reset();
    retry_.arm(retry_interval);
}

void AgentLink::send_resume()
{
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    std::string entropy(64, '\0');
    if (::getrandom(entropy.data(), entropy.size(), 0) != static_cast<ssize_t>(entropy.size()))
        throw_errno("getrandom for the restored guest's entropy");
    Json request{{"id", "agentvm-resume"}, {"op", "resume"},
                 {"time_ns", static_cast<uint64_t>(now.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(now.tv_nsec)},
                 {"pids_max", vm_.config().guest_pids_max}};
    put_bytes(request, "entropy", entropy);
    const std::string line = to_line(request);
    // A few hundred bytes into a fresh socket's empty buffer: written whole at once.
    if (::write(socket_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        throw_errno("sending the resume call to the guest agent");
    line_.clear();
    vm_.event_loop().watch_readable(socket_.get(), [this] { read_resume_answer(); });
}

void AgentLink::read_resume_answer()
{
    const LineRead read = read_line(max_resume_answer);
    if (read == LineRead::more)
        return;
    if (read == LineRead::closed) {
        // The agent took the connection and let it go unanswered (restarting, say): the
        // listener is there, so try again at once rather than after the refusal interval.
        // The give-up deadline still bounds the tries.
        spdlog::debug("the restored guest dropped the connection before answering resume");
        socket_.reset();
        attempt();
        return;
    }
    const Json answer = Json::parse(line_, nullptr, false);
    if (read == LineRead::line && answer.is_object() && answer.value("ok", false)) {
        connected();
        return;
    }
    done_ = true;
    give_up_.cancel();
    socket_.reset();
    on_failed_("the restored guest's agent did not take the resume call (clock, entropy, pids limit): " + line_);
}

void AgentLink::connected()
{
    spdlog::debug("agent ready{}", resume_ ? " (resumed)" : "");
    done_ = true;
    retry_.cancel();
    give_up_.cancel();
    on_connected_(std::move(socket_));
}

} // namespace agentvm
