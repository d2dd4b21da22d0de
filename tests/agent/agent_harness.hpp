// The host side of the agent tests: the real agentvm-agent binary started with
// --listen unix:PATH and --ports-listen unix:PATH (Agent), a client speaking the protocol to
// it (Client), and helpers that look for the processes calls leave behind.
#pragma once

#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include "common/base64.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm::agent_test {

using Clock = std::chrono::steady_clock;

// No single answer in these tests should take longer; a hang fails instead of blocking.
inline constexpr std::chrono::seconds reply_timeout{20};

inline uint64_t fnv1a(std::string_view bytes, uint64_t hash = 14695981039346656037ull)
{
    for (char c : bytes) {
        hash ^= static_cast<uint8_t>(c);
        hash *= 1099511628211ull;
    }
    return hash;
}

inline std::string make_temp_dir()
{
    std::string pattern = "/tmp/agentvm-agent-test.XXXXXX";
    if (!::mkdtemp(pattern.data()))
        throw std::runtime_error("mkdtemp failed");
    return pattern;
}

// Every /proc/PID/cmdline that contains `marker`, other than our own.
inline std::vector<pid_t> processes_with(const std::string& marker)
{
    std::vector<pid_t> found;
    DIR* proc = ::opendir("/proc");
    REQUIRE(proc);
    while (dirent* entry = ::readdir(proc)) {
        const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
        if (pid <= 0 || pid == ::getpid())
            continue;
        // Read with read(2): a process that exits meanwhile fails the read (ESRCH), which an
        // ifstream would throw about.
        std::string cmdline;
        const int fd = ::open((std::string("/proc/") + entry->d_name + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        char chunk[4096];
        for (ssize_t n; (n = ::read(fd, chunk, sizeof(chunk))) > 0;)
            cmdline.append(chunk, static_cast<size_t>(n));
        ::close(fd);
        if (cmdline.find(marker) != std::string::npos)
            found.push_back(pid);
    }
    ::closedir(proc);
    return found;
}

// Waits up to a second for processes to go (a SIGKILLed process vanishes once reaped).
// A background job is forked by the shell before it execs: wait for it to show.
inline bool appears(const std::string& marker)
{
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (processes_with(marker).empty() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return !processes_with(marker).empty();
}

inline bool gone(const std::string& marker)
{
    for (int i = 0; i < 100; ++i) {
        if (processes_with(marker).empty())
            return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

class Agent {
public:
    // oom_score_adj: the agent starts with it, as init starts the guest's agent with -1000
    // (tests use a positive value: raising it needs no privilege).
    // user_file: the agent's --user-file (the image's /etc/agentvm/user in the guest).
    // max_processes: the agent's --max-processes, when not 0.
    // accounts: the agent's --accounts, a directory with the passwd and group it reads instead
    // of /etc's, when not empty.
    explicit Agent(int oom_score_adj = 0, const std::string& user_file = "", int max_processes = 0,
                   const std::string& accounts = "")
        : dir_(make_temp_dir()), socket_path_(dir_ + "/agent.sock"), ports_socket_path_(dir_ + "/ports.sock")
    {
        const std::string adj = std::to_string(oom_score_adj);
        // The calls' user must reach the shell's FIFOs in dir_ (where TMPDIR puts them).
        if (!user_file.empty())
            REQUIRE(::chmod(dir_.c_str(), 0711) == 0);
        const std::string listen = "unix:" + socket_path_;
        // Never the default vsock:53: the host's vsock, where there is one, is no test's.
        const std::string ports_listen = "unix:" + ports_socket_path_;
        // Without --user-file, one that no host has: the calls run as root.
        const std::string users = user_file.empty() ? dir_ + "/no-user-file" : user_file;
        const std::string max = std::to_string(max_processes);
        // Made before the fork: a forked child of a threaded test should not allocate.
        std::vector<const char*> args{AGENTVM_AGENT_BIN, "--listen", listen.c_str(), "--ports-listen",
                                      ports_listen.c_str(), "--user-file", users.c_str()};
        if (max_processes != 0)
            args.insert(args.end(), {"--max-processes", max.c_str()});
        if (!accounts.empty())
            args.insert(args.end(), {"--accounts", accounts.c_str()});
        args.push_back(nullptr);
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            // The agent's shell FIFOs then go in dir_, removed with it.
            ::setenv("TMPDIR", dir_.c_str(), 1);
            if (oom_score_adj != 0) {
                const int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
                if (fd < 0 || ::write(fd, adj.data(), adj.size()) != static_cast<ssize_t>(adj.size()))
                    ::_exit(126);
            }
            ::execv(AGENTVM_AGENT_BIN, const_cast<char* const*>(args.data()));
            ::_exit(127);
        }
    }
    ~Agent()
    {
        ::kill(pid_, SIGTERM);
        ::waitpid(pid_, nullptr, 0);
        std::system(("rm -rf '" + dir_ + "'").c_str());
    }
    const std::string& dir() const { return dir_; }
    const std::string& socket_path() const { return socket_path_; }
    // The port relay's listener (guest/agent/port_relay.hpp).
    const std::string& ports_socket_path() const { return ports_socket_path_; }
    bool alive() const { return ::waitpid(pid_, nullptr, WNOHANG) == 0; }
    pid_t pid() const { return pid_; }

private:
    std::string dir_;
    std::string socket_path_;
    std::string ports_socket_path_;
    pid_t pid_ = -1;
};

class Client {
public:
    explicit Client(const Agent& agent)
    {
        const auto deadline = Clock::now() + std::chrono::seconds(10);
        for (;;) {
            fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            REQUIRE(fd_ >= 0);
            sockaddr_un addr{};
            addr.sun_family = AF_UNIX;
            std::strncpy(addr.sun_path, agent.socket_path().c_str(), sizeof(addr.sun_path) - 1);
            if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
                return;
            ::close(fd_);
            REQUIRE_MESSAGE(Clock::now() < deadline, "agent did not start listening");
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    ~Client() { close(); }
    void close()
    {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = -1;
    }

    void send_raw(std::string_view bytes)
    {
        while (!bytes.empty()) {
            const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
            REQUIRE(n > 0);
            bytes.remove_prefix(static_cast<size_t>(n));
        }
    }
    void send(const Json& request) { send_raw(to_line(request)); }
    void shutdown_sending() { ::shutdown(fd_, SHUT_WR); }

    // The next line, parsed; fails the test after reply_timeout. nullopt at EOF.
    std::optional<Json> next()
    {
        const auto deadline = Clock::now() + reply_timeout;
        for (;;) {
            const size_t newline = buffer_.find('\n');
            if (newline != std::string::npos) {
                Json line = Json::parse(buffer_.substr(0, newline));
                buffer_.erase(0, newline + 1);
                return line;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
            REQUIRE_MESSAGE(left.count() > 0, "no reply in time");
            pollfd pfd{fd_, POLLIN, 0};
            ::poll(&pfd, 1, static_cast<int>(left.count()));
            char chunk[1 << 16];
            const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
            if (n == 0)
                return std::nullopt;
            if (n > 0)
                buffer_.append(chunk, static_cast<size_t>(n));
        }
    }
    Json next_line()
    {
        std::optional<Json> line = next();
        REQUIRE(line);
        return *line;
    }

    // Sends one request and returns its final response; events go to `events`.
    Json call(const Json& request, std::vector<Json>* events = nullptr)
    {
        send(request);
        for (;;) {
            Json line = next_line();
            REQUIRE(line["id"] == request["id"]);
            if (!line.contains("event"))
                return line;
            if (events)
                events->push_back(line);
        }
    }

    Json exec(Json request)
    {
        request["id"] = ++next_id_;
        request["op"] = "exec";
        return call(request);
    }

private:
    int fd_ = -1;
    std::string buffer_;
    int next_id_ = 0;
};

// An image's user file (the agent's --user-file) with `text`, in a directory of its own.
struct UserFile {
    std::string path;
    explicit UserFile(const std::string& text)
    {
        path = make_temp_dir();
        std::ofstream(path + "/user") << text;
    }
    ~UserFile() { std::filesystem::remove_all(path); }
    std::string file() const { return path + "/user"; }
};

inline std::string bytes_of(const Json& response, const std::string& name)
{
    std::optional<std::string> bytes = get_bytes(response, name);
    REQUIRE_MESSAGE(bytes, name << " missing from " << response.dump());
    return *bytes;
}

} // namespace agentvm::agent_test
