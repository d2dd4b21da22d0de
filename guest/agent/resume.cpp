#include "guest/agent/resume.hpp"

#include <fcntl.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "guest/agent/call_cgroup.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

[[noreturn]] void io_error(const std::string& what)
{
    throw CallError("io", what + ": " + std::strerror(errno));
}

} // namespace

void resume_guest(const ResumeRequest& request)
{
    timespec now{};
    now.tv_sec = static_cast<time_t>(request.time_ns / 1'000'000'000);
    now.tv_nsec = static_cast<long>(request.time_ns % 1'000'000'000);
    if (::clock_settime(CLOCK_REALTIME, &now) != 0)
        io_error("clock_settime");

    Fd random(::open("/dev/urandom", O_WRONLY | O_CLOEXEC));
    if (!random)
        io_error("open /dev/urandom");
    // RNDADDENTROPY credits the bytes as entropy (a plain write would only mix them in), and
    // RNDRESEEDCRNG makes the generator use them now rather than at its next periodic reseed.
    std::vector<uint8_t> info(sizeof(rand_pool_info) + request.entropy.size());
    auto* pool = reinterpret_cast<rand_pool_info*>(info.data());
    pool->entropy_count = static_cast<int>(request.entropy.size() * 8);
    pool->buf_size = static_cast<int>(request.entropy.size());
    std::memcpy(info.data() + sizeof(rand_pool_info), request.entropy.data(), request.entropy.size());
    if (::ioctl(random.get(), RNDADDENTROPY, pool) != 0)
        io_error("RNDADDENTROPY");
    if (::ioctl(random.get(), RNDRESEEDCRNG) != 0)
        io_error("RNDRESEEDCRNG");

    if (request.pids_max)
        CallCgroup::set_pids_max(*request.pids_max);
}

} // namespace agentvm
