// A template image's user (/etc/agentvm/user, here the agent's --user-file): every process the
// agent starts runs with its uid, gid and groups, while the agent itself stays root; files a
// write_file call creates are the user's. Needs root, as the agent in the guest has.
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

namespace {

std::string out(const Json& answer)
{
    REQUIRE_MESSAGE(!answer.contains("error"), answer.dump());
    return bytes_of(answer, "stdout");
}

} // namespace

TEST_CASE("exec, the shell and run_code run as the image's user; write_file's new files are theirs")
{
    REQUIRE_MESSAGE(::geteuid() == 0, "the agent tests run as root, as the agent in the guest does");
    const UserFile users("65534:65533:4242,4343\n");
    // The user cannot reach tools under /root (a pyenv's python3): the system's, as in a guest.
    const std::string host_path = std::getenv("PATH") ? std::getenv("PATH") : "";
    ::setenv("PATH", "/usr/local/bin:/usr/bin:/bin", 1);
    Agent agent(0, users.file());
    ::setenv("PATH", host_path.c_str(), 1);
    Client client(agent);

    CHECK(out(client.call({{"id", 1}, {"op", "exec"}, {"argv", {"id", "-u"}}})) == "65534\n");
    CHECK(out(client.call({{"id", 2}, {"op", "exec"}, {"argv", {"id", "-g"}}})) == "65533\n");
    CHECK(out(client.call({{"id", 3}, {"op", "exec"}, {"argv", {"id", "-G"}}})) == "65533 4242 4343\n");
    // Root's files are out of reach: the credentials are the user's, capabilities gone.
    const Json denied = client.call({{"id", 4}, {"op", "exec"}, {"argv", {"cat", "/etc/shadow"}}});
    CHECK(denied.value("exit_code", 0) != 0);
    CHECK(bytes_of(denied, "stderr").find("Permission denied") != std::string::npos);
    CHECK(out(client.call({{"id", 5}, {"op", "shell"}, {"cmd", "id -u; cd /; pwd"}})) == "65534\n/\n");
    CHECK(out(client.call({{"id", 6}, {"op", "shell"}, {"cmd", "id -u; pwd"}})) == "65534\n/\n");
    const Json cell = client.call({{"id", 7}, {"op", "run_code"}, {"code", "import os\nos.getuid(), os.getgid()"}});
    REQUIRE_MESSAGE(!cell.contains("error"), cell.dump());
    CHECK(cell.value("result", "") == "(65534, 65533)");

    // A new file becomes the user's; an existing one keeps its owner.
    const std::string created = agent.dir() + "/created.txt";
    CHECK(client.call({{"id", 8}, {"op", "write_file"}, {"path", created}, {"data", "x"}}).value("ok", false));
    struct stat st {};
    REQUIRE(::stat(created.c_str(), &st) == 0);
    CHECK(st.st_uid == 65534);
    CHECK(st.st_gid == 65533);
    const std::string existing = agent.dir() + "/existing.txt";
    std::ofstream(existing) << "root's";
    CHECK(client.call({{"id", 9}, {"op", "write_file"}, {"path", existing}, {"data", "y"}}).value("ok", false));
    REQUIRE(::stat(existing.c_str(), &st) == 0);
    CHECK(st.st_uid == 0);
    CHECK(out(client.call({{"id", 10}, {"op", "exec"}, {"argv", {"sh", "-c", "echo more >> " + created + " && cat " + created}}}))
          == "xmore\n");
}

TEST_CASE("without a user file calls run as root; a malformed one stops the agent, saying why")
{
    REQUIRE_MESSAGE(::geteuid() == 0, "the agent tests run as root, as the agent in the guest does");
    {
        Agent agent;
        Client client(agent);
        CHECK(out(client.call({{"id", 1}, {"op", "exec"}, {"argv", {"id", "-u"}}})) == "0\n");
    }
    const UserFile users("app\n");
    Agent agent(0, users.file());
    const auto deadline = Clock::now() + reply_timeout;
    while (agent.alive() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(!agent.alive());
    CHECK(!std::filesystem::exists(agent.socket_path()));
}
