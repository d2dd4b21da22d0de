// Files as objects on the real agent: make_dir, move, remove, watch, the new fields of stat
// and list_dir, list_dir's depth, and all of them acting as an image's user. Hostile trees
// (10,000 deep, symlinks pointing out, a mount inside, a watch of /) and a burst of changes
// that outruns the client. Needs root, as the agent in the guest has (mounts, chown, users).
#include "tests/agent/agent_harness.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include <utility>

using namespace agentvm;
using namespace agentvm::agent_test;

// Named, not anonymous: the agent tests are one unity translation unit, whose other files
// have helpers of the same names in theirs.
namespace file_ops_test {

void write_text(const std::string& path, const std::string& text)
{
    std::ofstream file(path, std::ios::binary);
    REQUIRE(file);
    file << text;
}

// A new empty file with a create event and no write event (nothing is written): a marker a
// test waits for among a watch's events.
void create_marker(const std::string& path)
{
    const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    REQUIRE_MESSAGE(fd >= 0, path);
    ::close(fd);
}

std::string read_text(const std::string& path)
{
    std::ifstream file(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

bool exists(const std::string& path)
{
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0;
}

struct stat stat_of(const std::string& path)
{
    struct stat st {};
    REQUIRE_MESSAGE(::lstat(path.c_str(), &st) == 0, path);
    return st;
}

uint32_t mode_of(const std::string& path)
{
    return stat_of(path).st_mode & 07777;
}

std::string error_code(const Json& answer)
{
    return answer.contains("error") ? answer["error"]["code"].get<std::string>() : "";
}

std::string error_message(const Json& answer)
{
    return answer.contains("error") ? answer["error"]["message"].get<std::string>() : "";
}

bool ok(const Json& answer)
{
    return answer.value("ok", false);
}

// The agent's pid, once it runs (its command line names its socket).
pid_t agent_pid(const Agent& agent)
{
    REQUIRE(appears(agent.socket_path()));
    const std::vector<pid_t> pids = processes_with(agent.socket_path());
    REQUIRE(pids.size() == 1);
    return pids[0];
}

// A number from /proc/PID/status (kB for the memory fields).
long status_field(pid_t pid, const std::string& field)
{
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind(field + ":", 0) == 0)
            return std::stol(line.substr(field.size() + 1));
    FAIL("no " << field << " in /proc/" << pid << "/status");
    return -1;
}

size_t inotify_fds(pid_t pid)
{
    size_t count = 0;
    const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        std::error_code error;
        if (std::filesystem::read_symlink(entry.path(), error).string() == "anon_inode:inotify")
            ++count;
    }
    return count;
}

std::string name_or_number(uint32_t id, bool user)
{
    if (user) {
        const passwd* entry = ::getpwuid(id);
        return entry ? entry->pw_name : std::to_string(id);
    }
    const group* entry = ::getgrgid(id);
    return entry ? entry->gr_name : std::to_string(id);
}

// An id that neither /etc/passwd nor /etc/group names on this host.
uint32_t unnamed_id()
{
    for (uint32_t id = 54321;; ++id)
        if (!::getpwuid(id) && !::getgrgid(id))
            return id;
}

// Starts a watch and waits for its "watching".
void start_watch(Client& client, const Json& id, const std::string& path, bool recursive)
{
    client.send({{"id", id}, {"op", "watch"}, {"path", path}, {"recursive", recursive}});
    const Json first = client.next_line();
    REQUIRE_MESSAGE(first.value("event", "") == "watching", first.dump());
    CHECK(first["id"] == id);
}

using Change = std::pair<std::string, std::string>;  // type, name

// "type name, type name": readable in a failed CHECK.
std::string show(const std::vector<Change>& changes)
{
    std::string text;
    for (const auto& [type, name] : changes)
        text += (text.empty() ? "" : ", ") + type + " " + name;
    return text;
}

// The changes a watch reports until the creation of `marker` (not included).
std::vector<Change> changes_until(Client& client, const std::string& marker)
{
    std::vector<Change> changes;
    for (;;) {
        const Json line = client.next_line();
        REQUIRE_MESSAGE(line.value("event", "") == "fs", line.dump());
        Change change{line["type"].get<std::string>(), bytes_of(line, "name")};
        if (change == Change{"create", marker})
            return changes;
        changes.push_back(std::move(change));
    }
}

// Cancels the watch `id` and checks both answers.
void cancel_watch(Client& client, const Json& id, const Json& cancel_id)
{
    client.send({{"id", cancel_id}, {"op", "cancel"}, {"call", id}});
    bool cancel_answered = false;
    for (;;) {
        const Json line = client.next_line();
        if (line["id"] == cancel_id) {
            CHECK(line["running"] == true);
            cancel_answered = true;
            continue;
        }
        REQUIRE(line["id"] == id);
        if (line.contains("event"))
            continue;  // changes still on their way
        CHECK(line["ok"] == true);
        CHECK(line["ended"] == "cancelled");
        CHECK(line["cancelled"] == true);
        break;
    }
    if (!cancel_answered)
        CHECK(client.next_line()["running"] == true);
}

// A directory tree made with *at calls, so it may be deeper than PATH_MAX allows to name.
void make_chain(const std::string& top, int depth)
{
    int fd = ::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    for (int i = 0; i < depth; ++i) {
        REQUIRE(::mkdirat(fd, "d", 0755) == 0);
        const int next = ::openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        ::close(fd);
        REQUIRE(next >= 0);
        fd = next;
    }
    const int file = ::openat(fd, "leaf", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(file >= 0);
    ::close(file);
    ::close(fd);
}

// A tmpfs mounted for a test, gone with it.
struct TmpfsMount {
    std::string path;
    explicit TmpfsMount(std::string at) : path(std::move(at))
    {
        REQUIRE(::mkdir(path.c_str(), 0755) == 0);
        REQUIRE_MESSAGE(::mount("none", path.c_str(), "tmpfs", 0, "size=64m") == 0, std::strerror(errno));
    }
    ~TmpfsMount() { ::umount2(path.c_str(), MNT_DETACH); }
};

TEST_CASE("make_dir makes the missing parents with exactly the mode asked and says whether it made the directory")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir();

    Json made = client.call({{"id", 1}, {"op", "make_dir"}, {"path", dir + "/a/b/c"}, {"mode", "0777"}});
    REQUIRE_MESSAGE(ok(made), made.dump());
    CHECK(made["created"] == true);
    // 0777 despite the umask, on every directory it made.
    for (const char* path : {"/a", "/a/b", "/a/b/c"})
        CHECK(mode_of(dir + path) == 0777);

    made = client.call({{"id", 2}, {"op", "make_dir"}, {"path", dir + "/a/b/c"}, {"mode", "0700"}});
    CHECK(ok(made));
    CHECK(made["created"] == false);
    CHECK(mode_of(dir + "/a/b/c") == 0777);  // an existing directory keeps its mode

    // Default 0755; trailing slashes; through a symlink to a directory.
    REQUIRE(::symlink((dir + "/a").c_str(), (dir + "/to-a").c_str()) == 0);
    made = client.call({{"id", 3}, {"op", "make_dir"}, {"path", dir + "/to-a/new/"}});
    CHECK(made["created"] == true);
    CHECK(mode_of(dir + "/a/new") == 0755);
    // Parents without search permission for their owner still get the mode.
    made = client.call({{"id", 4}, {"op", "make_dir"}, {"path", dir + "/p/q"}, {"mode", "0600"}});
    CHECK(made["created"] == true);
    CHECK(mode_of(dir + "/p") == 0600);
    REQUIRE(::chmod((dir + "/p").c_str(), 0700) == 0);
    CHECK(mode_of(dir + "/p/q") == 0600);

    write_text(dir + "/file", "x");
    Json refused = client.call({{"id", 5}, {"op", "make_dir"}, {"path", dir + "/file"}});
    CHECK(error_code(refused) == "exists");
    refused = client.call({{"id", 6}, {"op", "make_dir"}, {"path", dir + "/file/sub/deeper"}});
    CHECK(error_code(refused) == "exists");
    CHECK(error_message(refused).find(dir + "/file exists and is not a directory") != std::string::npos);
    CHECK(!exists(dir + "/file/sub"));
    REQUIRE(::symlink("nowhere", (dir + "/dangling").c_str()) == 0);
    CHECK(error_code(client.call({{"id", 7}, {"op", "make_dir"}, {"path", dir + "/dangling"}})) == "exists");
    CHECK(error_code(client.call({{"id", 8}, {"op", "make_dir"}, {"path", dir + "/m"}, {"mode", "9"}})) == "bad_field");
}

TEST_CASE("move renames, replaces a file at the destination and describes it; missing paths are not_found")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir();
    write_text(dir + "/a.txt", "hello");

    Json moved = client.call({{"id", 1}, {"op", "move"}, {"from", dir + "/a.txt"}, {"to", dir + "/b.txt"}});
    REQUIRE_MESSAGE(ok(moved), moved.dump());
    const Json& entry = moved["entry"];
    CHECK(entry["name"] == "b.txt");
    CHECK(entry["path"] == dir + "/b.txt");
    CHECK(entry["type"] == "file");
    CHECK(entry["size"] == 5);
    CHECK(entry["owner"] == "root");
    CHECK(!exists(dir + "/a.txt"));

    write_text(dir + "/c.txt", "old");
    CHECK(ok(client.call({{"id", 2}, {"op", "move"}, {"from", dir + "/b.txt"}, {"to", dir + "/c.txt"}})));
    CHECK(read_text(dir + "/c.txt") == "hello");

    // A symlink moves itself, and is described as one.
    REQUIRE(::symlink("c.txt", (dir + "/link").c_str()) == 0);
    moved = client.call({{"id", 3}, {"op", "move"}, {"from", dir + "/link"}, {"to", dir + "/link2"}});
    CHECK(moved["entry"]["type"] == "symlink");
    CHECK(moved["entry"]["symlink_target"] == "c.txt");

    CHECK(error_code(client.call({{"id", 4}, {"op", "move"}, {"from", dir + "/none"}, {"to", dir + "/x"}})) == "not_found");
    CHECK(error_code(client.call({{"id", 5}, {"op", "move"}, {"from", dir + "/c.txt"}, {"to", dir + "/no/x"}}))
          == "not_found");
    REQUIRE(::mkdir((dir + "/d1").c_str(), 0755) == 0);
    REQUIRE(::mkdir((dir + "/d2").c_str(), 0755) == 0);
    write_text(dir + "/d2/kept", "");
    CHECK(error_code(client.call({{"id", 6}, {"op", "move"}, {"from", dir + "/d1"}, {"to", dir + "/d2"}})) == "not_empty");
    CHECK(error_code(client.call({{"id", 7}, {"op", "move"}, {"from", dir + "/d1"}, {"to", dir + "/c.txt"}})) == "io");
    CHECK(exists(dir + "/d2/kept"));

    // /dev/shm (or /proc) is another file system: rename cannot get there.
    const std::string other = stat_of("/dev/shm").st_dev != stat_of(dir).st_dev ? "/dev/shm" : "/proc";
    const Json across = client.call(
        {{"id", 8}, {"op", "move"}, {"from", dir + "/c.txt"}, {"to", other + "/agentvm-move-test"}});
    CHECK(error_code(across) == "io");
    CHECK(error_message(across).find("EXDEV") != std::string::npos);
    CHECK(exists(dir + "/c.txt"));
}

TEST_CASE("remove takes files, symlinks (never their targets) and empty directories; a full one only recursive")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir();
    const std::string outside = dir + "/outside";
    REQUIRE(::mkdir(outside.c_str(), 0755) == 0);
    write_text(outside + "/precious", "keep me");

    write_text(dir + "/f", "x");
    CHECK(ok(client.call({{"id", 1}, {"op", "remove"}, {"path", dir + "/f"}})));
    CHECK(!exists(dir + "/f"));
    REQUIRE(::symlink(outside.c_str(), (dir + "/link").c_str()) == 0);
    CHECK(ok(client.call({{"id", 2}, {"op", "remove"}, {"path", dir + "/link"}, {"recursive", true}})));
    CHECK(!exists(dir + "/link"));
    CHECK(read_text(outside + "/precious") == "keep me");

    REQUIRE(::mkdir((dir + "/empty").c_str(), 0755) == 0);
    CHECK(ok(client.call({{"id", 3}, {"op", "remove"}, {"path", dir + "/empty/"}})));
    CHECK(!exists(dir + "/empty"));

    // A tree with symlinks out of it, to a directory and to a file, and a name that is not UTF-8.
    const std::string tree = dir + "/tree";
    REQUIRE(::mkdir(tree.c_str(), 0755) == 0);
    REQUIRE(::mkdir((tree + "/sub").c_str(), 0755) == 0);
    REQUIRE(::mkdir((tree + "/sub/deeper").c_str(), 0700) == 0);
    write_text(tree + "/sub/deeper/file", "x");
    write_text(tree + "/\xff", "x");
    REQUIRE(::symlink(outside.c_str(), (tree + "/sub/out-dir").c_str()) == 0);
    REQUIRE(::symlink((outside + "/precious").c_str(), (tree + "/out-file").c_str()) == 0);
    const Json refused = client.call({{"id", 4}, {"op", "remove"}, {"path", tree}});
    CHECK(error_code(refused) == "not_empty");
    CHECK(exists(tree + "/sub/deeper/file"));
    CHECK(ok(client.call({{"id", 5}, {"op", "remove"}, {"path", tree}, {"recursive", true}})));
    CHECK(!exists(tree));
    CHECK(read_text(outside + "/precious") == "keep me");

    CHECK(error_code(client.call({{"id", 6}, {"op", "remove"}, {"path", dir + "/none"}})) == "not_found");
    CHECK(error_code(client.call({{"id", 7}, {"op", "remove"}, {"path", dir + "/none/x"}})) == "not_found");
    CHECK(error_code(client.call({{"id", 8}, {"op", "remove"}, {"path", "/"}, {"recursive", true}})) == "io");
    CHECK(exists("/etc/passwd"));
}

TEST_CASE("remove: a 10,000-deep tree goes with a few descriptors and no deep stack")
{
    // The agent gets a descriptor limit far below the depth: a walk holding one descriptor
    // per level would fail.
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    rlimit low = saved;
    low.rlim_cur = 256;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    Agent agent;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
    Client client(agent);
    // On a tmpfs of its own: on a disk's file system 10,000 rmdirs can take longer than a
    // call may here (GNU rm takes 15 s on this test's host).
    const TmpfsMount fs(agent.dir() + "/fs");
    const std::string top = fs.path + "/deep";
    REQUIRE(::mkdir(top.c_str(), 0755) == 0);
    make_chain(top, 10000);

    CHECK(error_code(client.call({{"id", 1}, {"op", "remove"}, {"path", top}})) == "not_empty");
    const Json removed = client.call({{"id", 2}, {"op", "remove"}, {"path", top}, {"recursive", true}});
    CHECK_MESSAGE(ok(removed), removed.dump());
    CHECK(!exists(top));
    CHECK(agent.alive());
}

TEST_CASE("remove never crosses into another mount")
{
    Agent agent;
    Client client(agent);
    const std::string tree = agent.dir() + "/tree";
    REQUIRE(::mkdir(tree.c_str(), 0755) == 0);
    const TmpfsMount fs(tree + "/mnt");
    const std::string& mounted = fs.path;
    write_text(mounted + "/on-the-mount", "keep me");

    const Json refused = client.call({{"id", 1}, {"op", "remove"}, {"path", tree}, {"recursive", true}});
    CHECK(error_code(refused) == "io");
    CHECK(error_message(refused).find("mount point") != std::string::npos);
    CHECK(read_text(mounted + "/on-the-mount") == "keep me");
    // The mount point itself is refused before anything in it goes.
    CHECK(error_code(client.call({{"id", 2}, {"op", "remove"}, {"path", mounted}, {"recursive", true}})) == "io");
    CHECK(read_text(mounted + "/on-the-mount") == "keep me");
}

TEST_CASE("stat and list_dir give names, paths, owners by number and by name, mtime and symlink targets")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir() + "/info";
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    write_text(dir + "/f.txt", "hello");
    const uint32_t nobody = unnamed_id();
    REQUIRE(::chown((dir + "/f.txt").c_str(), nobody, nobody) == 0);
    REQUIRE(::symlink("f.txt", (dir + "/link").c_str()) == 0);

    const Json file = client.call({{"id", 1}, {"op", "stat"}, {"path", dir + "/f.txt"}});
    REQUIRE_MESSAGE(ok(file), file.dump());
    CHECK(file["name"] == "f.txt");
    CHECK(file["path"] == dir + "/f.txt");
    CHECK(file["uid"] == nobody);
    CHECK(file["gid"] == nobody);
    CHECK(file["owner"] == std::to_string(nobody));
    CHECK(file["group"] == std::to_string(nobody));
    CHECK(!file.contains("symlink_target"));

    // stat follows the link and still says where it points.
    const Json link = client.call({{"id", 2}, {"op", "stat"}, {"path", dir + "/link"}});
    CHECK(link["type"] == "file");
    CHECK(link["size"] == 5);
    CHECK(link["symlink_target"] == "f.txt");
    CHECK(link["name"] == "link");

    const Json top = client.call({{"id", 3}, {"op", "stat"}, {"path", dir}});
    CHECK(top["uid"] == 0);
    CHECK(top["owner"] == name_or_number(0, true));
    CHECK(top["group"] == name_or_number(0, false));
    CHECK(client.call({{"id", 4}, {"op", "stat"}, {"path", "/"}})["name"] == "/");

    const Json listed = client.call({{"id", 5}, {"op", "list_dir"}, {"path", dir + "/"}});
    REQUIRE(listed["entries"].size() == 2);
    const Json& plain = listed["entries"][0];
    CHECK(plain["name"] == "f.txt");
    CHECK(plain["path"] == dir + "/f.txt");
    CHECK(plain["owner"] == std::to_string(nobody));
    CHECK(plain["uid"] == nobody);
    CHECK(plain["mtime"].get<double>() > 0);
    CHECK(!plain.contains("symlink_target"));
    const Json& symlink = listed["entries"][1];
    CHECK(symlink["type"] == "symlink");
    CHECK(symlink["symlink_target"] == "f.txt");
    CHECK(symlink["owner"] == name_or_number(0, true));
}

TEST_CASE("list_dir depth: subdirectories in tree order, names relative, symlinked directories not entered")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir() + "/tree";
    const std::string outside = agent.dir() + "/outside";
    for (const std::string& path : {dir, dir + "/a", dir + "/a/y", dir + "/c", outside})
        REQUIRE(::mkdir(path.c_str(), 0755) == 0);
    write_text(dir + "/a/x", "");
    write_text(dir + "/a/y/z", "");
    write_text(dir + "/a.txt", "");
    write_text(outside + "/secret", "");
    REQUIRE(::symlink(outside.c_str(), (dir + "/b").c_str()) == 0);

    auto names = [&](const Json& request) {
        const Json answer = client.call(request);
        REQUIRE_MESSAGE(ok(answer), answer.dump());
        std::vector<std::string> found;
        for (const Json& entry : answer["entries"])
            found.push_back(entry["name"].get<std::string>());
        return std::make_pair(found, answer["truncated"].get<bool>());
    };
    using Names = std::vector<std::string>;
    CHECK(names({{"id", 1}, {"op", "list_dir"}, {"path", dir}}).first == Names{"a", "a.txt", "b", "c"});
    CHECK(names({{"id", 2}, {"op", "list_dir"}, {"path", dir}, {"depth", 2}}).first
          == Names{"a", "a/x", "a/y", "a.txt", "b", "c"});
    const auto all = names({{"id", 3}, {"op", "list_dir"}, {"path", dir}, {"depth", 3}});
    CHECK(all.first == Names{"a", "a/x", "a/y", "a/y/z", "a.txt", "b", "c"});
    CHECK(all.second == false);
    CHECK(names({{"id", 4}, {"op", "list_dir"}, {"path", dir}, {"depth", 3}, {"max_entries", 7}}).second == false);
    const auto cut = names({{"id", 5}, {"op", "list_dir"}, {"path", dir}, {"depth", 3}, {"max_entries", 3}});
    CHECK(cut.first == Names{"a", "a/x", "a/y"});
    CHECK(cut.second == true);
    CHECK(names({{"id", 6}, {"op", "list_dir"}, {"path", dir}, {"depth", 3}, {"max_entries", 6}}).second == true);
    const Json paths = client.call({{"id", 7}, {"op", "list_dir"}, {"path", dir}, {"depth", 3}});
    CHECK(paths["entries"][3]["path"] == dir + "/a/y/z");

    // 64 levels at most, however deep the tree.
    const std::string deep = agent.dir() + "/deep";
    REQUIRE(::mkdir(deep.c_str(), 0755) == 0);
    make_chain(deep, 70);
    const auto levels = names({{"id", 8}, {"op", "list_dir"}, {"path", deep}, {"depth", 64}});
    REQUIRE(levels.first.size() == 64);
    CHECK(levels.first.back().size() == 64 * 2 - 1);  // d/d/…/d
    CHECK(error_code(client.call({{"id", 9}, {"op", "list_dir"}, {"path", deep}, {"depth", 65}})) == "bad_field");
}

TEST_CASE("watch reports create, write, chmod, rename and remove, and ends when cancelled")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir() + "/watched";
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    start_watch(client, 1, dir, false);

    write_text(dir + "/a.txt", "data");
    REQUIRE(::chmod((dir + "/a.txt").c_str(), 0600) == 0);
    REQUIRE(::rename((dir + "/a.txt").c_str(), (dir + "/b.txt").c_str()) == 0);
    REQUIRE(::unlink((dir + "/b.txt").c_str()) == 0);
    REQUIRE(::mkdir((dir + "/sub").c_str(), 0755) == 0);
    write_text(dir + "/sub/unseen", "not recursive");
    write_text(dir + "/\xfe", "");
    create_marker(dir + "/marker");
    const std::vector<Change> expected{{"create", "a.txt"}, {"write", "a.txt"},  {"chmod", "a.txt"},
                                       {"remove", "a.txt"}, {"create", "b.txt"}, {"remove", "b.txt"},
                                       {"create", "sub"},   {"create", "\xfe"},  {"write", "\xfe"}};
    CHECK(show(changes_until(client, "marker")) == show(expected));
    cancel_watch(client, 1, 2);

    CHECK(error_code(client.call({{"id", 3}, {"op", "watch"}, {"path", dir + "/none"}})) == "not_found");
    CHECK(error_code(client.call({{"id", 4}, {"op", "watch"}, {"path", dir + "/marker"}})) == "not_found");
}

TEST_CASE("a recursive watch watches new subdirectories, reports what they held, and follows no symlink or moved-out tree")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir() + "/watched";
    const std::string outside = agent.dir() + "/outside";
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    REQUIRE(::mkdir((dir + "/sub").c_str(), 0755) == 0);
    REQUIRE(::mkdir(outside.c_str(), 0755) == 0);
    REQUIRE(::symlink(outside.c_str(), (dir + "/link").c_str()) == 0);
    start_watch(client, 1, dir, true);

    write_text(dir + "/sub/f", "");
    write_text(outside + "/through-link", "");
    create_marker(dir + "/m1");
    CHECK(show(changes_until(client, "m1")) == show(std::vector<Change>{{"create", "sub/f"}, {"write", "sub/f"}}));

    // A tree moved in: only its top has an event of its own; the rest is found by the scan.
    const std::string built = agent.dir() + "/built";
    REQUIRE(::mkdir(built.c_str(), 0755) == 0);
    REQUIRE(::mkdir((built + "/u").c_str(), 0755) == 0);
    write_text(built + "/u/v.txt", "");
    REQUIRE(::rename(built.c_str(), (dir + "/t").c_str()) == 0);
    create_marker(dir + "/m2");
    std::vector<Change> changes = changes_until(client, "m2");
    std::sort(changes.begin(), changes.end());
    CHECK(show(changes) == show(std::vector<Change>{{"create", "t"}, {"create", "t/u"}, {"create", "t/u/v.txt"}}));

    // Its subdirectories are watched now; once moved out, nothing in it is reported.
    write_text(dir + "/t/u/w", "");
    REQUIRE(::rename((dir + "/t").c_str(), (outside + "/t2").c_str()) == 0);
    write_text(outside + "/t2/u/after-move", "");
    // A file made in a new directory at once, likely before its watch: the scan finds it.
    REQUIRE(::mkdir((dir + "/t3").c_str(), 0755) == 0);
    const int made = ::open((dir + "/t3/new").c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(made >= 0);
    ::close(made);
    create_marker(dir + "/m3");
    changes = changes_until(client, "m3");
    // t3/new may come twice: from the scan of t3 and from its own event.
    changes.erase(std::unique(changes.begin(), changes.end()), changes.end());
    CHECK(show(changes) == show(std::vector<Change>{{"create", "t/u/w"}, {"write", "t/u/w"}, {"remove", "t"}, {"create", "t3"},
                                         {"create", "t3/new"}}));
    cancel_watch(client, 1, 2);
}

TEST_CASE("a watch ends when its directory goes, on close and end of requests; its inotify descriptor goes with it")
{
    Agent agent;
    const pid_t pid = agent_pid(agent);
    const std::string dir = agent.dir() + "/watched";
    {
        Client client(agent);
        REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
        start_watch(client, 1, dir, true);
        CHECK(inotify_fds(pid) == 1);
        REQUIRE(::rmdir(dir.c_str()) == 0);
        Json line = client.next_line();
        while (line.contains("event"))
            line = client.next_line();
        CHECK(line == Json{{"id", 1}, {"ok", true}, {"ended", "removed"}});
    }
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    {
        // Nothing could cancel it after close: it ends, then close answers.
        Client client(agent);
        start_watch(client, 2, dir, false);
        client.send({{"id", 3}, {"op", "close"}});
        CHECK(client.next_line() == Json{{"id", 2}, {"ok", true}, {"ended", "closed"}});
        CHECK(client.next_line() == Json{{"id", 3}, {"ok", true}});
    }
    {
        Client client(agent);
        start_watch(client, 4, dir, false);
        client.shutdown_sending();
        CHECK(client.next_line() == Json{{"id", 4}, {"ok", true}, {"ended", "closed"}});
    }
    {
        Client client(agent);
        start_watch(client, 5, dir, false);
        start_watch(client, 6, dir, true);
        CHECK(inotify_fds(pid) == 2);
        client.close();
        const auto deadline = Clock::now() + reply_timeout;
        while (inotify_fds(pid) > 0 && Clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        CHECK(inotify_fds(pid) == 0);
    }
}

TEST_CASE("watch limits: 8192 directories a watch, 64 watches an agent; a watch of / neither hangs nor harms")
{
    Agent agent;
    Client client(agent);
    const TmpfsMount fs(agent.dir() + "/big");  // thousands of directories, made and gone fast
    const std::string& dir = fs.path;
    for (size_t i = 1; i < 8192; ++i)
        REQUIRE(::mkdir((dir + "/d" + std::to_string(i)).c_str(), 0755) == 0);
    // The directory and 8191 below it: all watched.
    start_watch(client, 1, dir, true);
    // Past the limit later: said once, and changes where it watches still come.
    REQUIRE(::mkdir((dir + "/e1").c_str(), 0755) == 0);
    REQUIRE(::mkdir((dir + "/e2").c_str(), 0755) == 0);
    write_text(dir + "/d1/f", "");
    create_marker(dir + "/marker");
    size_t overflows = 0;
    std::vector<Change> changes;
    for (;;) {
        const Json line = client.next_line();
        if (line["event"] == "overflow") {
            ++overflows;
            continue;
        }
        if (bytes_of(line, "name") == "marker")
            break;
        changes.emplace_back(line["type"], bytes_of(line, "name"));
    }
    CHECK(overflows == 1);
    CHECK(show(changes) == show(std::vector<Change>{{"create", "e1"}, {"create", "e2"}, {"create", "d1/f"}, {"write", "d1/f"}}));
    cancel_watch(client, 1, 2);

    // One more from the start: refused.
    REQUIRE(::mkdir((dir + "/e3").c_str(), 0755) == 0);
    const Json refused = client.call({{"id", 3}, {"op", "watch"}, {"path", dir}, {"recursive", true}});
    CHECK(error_code(refused) == "limit");
    CHECK(error_message(refused).find("8192") != std::string::npos);

    // / has far more directories than that on any host with a compiler: refused at once (a
    // watch keeps to its file system, so /proc and /sys do not count), or else watched.
    client.send({{"id", 4}, {"op", "watch"}, {"path", "/"}, {"recursive", true}});
    const Json root = client.next_line();
    if (root.value("event", "") == "watching")
        cancel_watch(client, 4, 5);
    else
        CHECK(error_code(root) == "limit");
    CHECK(ok(client.call({{"id", 6}, {"op", "stat"}, {"path", "/"}})));

    // 64 at once, here on one connection.
    for (int i = 0; i < 64; ++i)
        start_watch(client, 100 + i, agent.dir(), false);
    const Json too_many = client.call({{"id", 200}, {"op", "watch"}, {"path", agent.dir()}});
    CHECK(error_code(too_many) == "limit");
    CHECK(error_message(too_many).find("64") != std::string::npos);
    cancel_watch(client, 100, 201);
    start_watch(client, 202, agent.dir(), false);
}

TEST_CASE("a burst of 10,000 creations gives 10,000 create events, none lost")
{
    Agent agent;
    Client client(agent);
    const pid_t pid = agent_pid(agent);
    const std::string dir = agent.dir() + "/burst";
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    start_watch(client, 1, dir, false);
    const long rss_before = status_field(pid, "VmRSS");

    constexpr int files = 10000;
    std::thread creator([&] {
        for (int i = 0; i < files; ++i) {
            // Read-only: a create and no close-after-write event.
            const int fd = ::open((dir + "/f" + std::to_string(i)).c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
            if (fd >= 0)
                ::close(fd);
        }
    });
    std::set<std::string> created;
    size_t overflows = 0;
    while (created.size() < files) {
        const Json line = client.next_line();
        if (line["event"] == "overflow") {
            ++overflows;
            break;
        }
        REQUIRE(line["type"] == "create");
        created.insert(bytes_of(line, "name"));
    }
    creator.join();
    CHECK(overflows == 0);
    CHECK(created.size() == files);
    CHECK(created.contains("f0"));
    CHECK(created.contains("f9999"));
    CHECK(status_field(pid, "VmRSS") - rss_before < 16 * 1024);
    cancel_watch(client, 1, 2);
}

TEST_CASE("a client that stops reading holds the watch up, not the agent's memory")
{
    Agent agent;
    Client client(agent);
    const pid_t pid = agent_pid(agent);
    const TmpfsMount fs(agent.dir() + "/flood");  // tens of thousands of files, made and gone fast
    const std::string& dir = fs.path;
    start_watch(client, 1, dir, false);
    const long rss_before = status_field(pid, "VmRSS");

    // More than the kernel queues, with long names: an agent that kept reading inotify into
    // its outbox would hold 20 MB and more.
    const long kernel_queue = std::stol(read_text("/proc/sys/fs/inotify/max_queued_events"));
    const long files = kernel_queue + 50000;
    const std::string padding(200, 'p');
    for (long i = 0; i < files; ++i) {
        const int fd = ::open((dir + "/" + padding + std::to_string(i)).c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
        REQUIRE(fd >= 0);
        ::close(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const long grown_kb = status_field(pid, "VmRSS") - rss_before;
    CHECK_MESSAGE(grown_kb < 8 * 1024, "the agent grew by " << grown_kb << " kB");

    // What the kernel could not queue is an overflow; the watch then goes on, and sees the
    // marker made once the overflow shows the kernel's queue has room again.
    size_t creates = 0;
    size_t overflows = 0;
    for (;;) {
        const Json line = client.next_line();
        if (line["event"] == "overflow") {
            if (++overflows == 1)
                create_marker(dir + "/marker");
            continue;
        }
        if (bytes_of(line, "name") == "marker")
            break;
        ++creates;
    }
    CHECK(overflows >= 1);
    CHECK(creates < static_cast<size_t>(files));
    cancel_watch(client, 1, 2);
}

TEST_CASE("as the image's user: the user's permissions and groups, new directories theirs, the agent's own rights kept")
{
    REQUIRE_MESSAGE(::geteuid() == 0, "the agent tests run as root, as the agent in the guest does");
    const UserFile users("65534:65533:4242\n");
    Agent agent(0, users.file());
    Client client(agent);
    const std::string open = agent.dir() + "/open";
    const std::string closed = agent.dir() + "/root-only";
    const std::string group_only = agent.dir() + "/group-only";
    REQUIRE(::mkdir(open.c_str(), 0777) == 0);
    REQUIRE(::chmod(open.c_str(), 0777) == 0);
    REQUIRE(::mkdir(closed.c_str(), 0700) == 0);
    write_text(closed + "/file", "root's");
    REQUIRE(::mkdir(group_only.c_str(), 0070) == 0);
    REQUIRE(::chmod(group_only.c_str(), 0070) == 0);  // past the umask
    REQUIRE(::chown(group_only.c_str(), 0, 4242) == 0);

    const Json made = client.call({{"id", 1}, {"op", "make_dir"}, {"path", open + "/new/deeper"}});
    REQUIRE_MESSAGE(ok(made), made.dump());
    for (const std::string& path : {open + "/new", open + "/new/deeper"}) {
        CHECK(stat_of(path).st_uid == 65534);
        CHECK(stat_of(path).st_gid == 65533);
    }
    const Json described = client.call({{"id", 2}, {"op", "stat"}, {"path", open + "/new"}});
    CHECK(described["owner"] == name_or_number(65534, true));
    CHECK(described["uid"] == 65534);
    // A supplementary group opens what the gid alone does not.
    const Json in_group = client.call({{"id", 3}, {"op", "make_dir"}, {"path", group_only + "/x"}});
    CHECK_MESSAGE(ok(in_group), in_group.dump());

    const std::vector<Json> refused{
        client.call({{"id", 4}, {"op", "make_dir"}, {"path", closed + "/x"}}),
        client.call({{"id", 5}, {"op", "stat"}, {"path", closed + "/file"}}),
        client.call({{"id", 6}, {"op", "list_dir"}, {"path", closed}}),
        client.call({{"id", 7}, {"op", "remove"}, {"path", closed + "/file"}}),
        client.call({{"id", 8}, {"op", "move"}, {"from", closed + "/file"}, {"to", open + "/stolen"}}),
        client.call({{"id", 9}, {"op", "watch"}, {"path", closed}}),
        client.call({{"id", 10}, {"op", "remove"}, {"path", agent.dir() + "/group-only"}, {"recursive", true}}),
    };
    for (const Json& answer : refused) {
        CHECK_MESSAGE(error_code(answer) == "io", answer.dump());
        CHECK_MESSAGE(error_message(answer).find("Permission denied") != std::string::npos, answer.dump());
    }
    CHECK(read_text(closed + "/file") == "root's");
    CHECK(exists(group_only + "/x"));

    // The user's rights were this thread's for the call only: write_file, root's as before,
    // still reaches where the user cannot, also while a watch holds the user's on its thread.
    start_watch(client, 11, open, true);
    const Json written = client.call({{"id", 12}, {"op", "write_file"}, {"path", closed + "/w"}, {"data", "root"}});
    CHECK_MESSAGE(ok(written), written.dump());
    CHECK(read_text(closed + "/w") == "root");
    cancel_watch(client, 11, 13);
    CHECK(ok(client.call({{"id", 14}, {"op", "remove"}, {"path", open + "/new"}, {"recursive", true}})));
    CHECK(!exists(open + "/new"));
}

} // namespace file_ops_test
