// The parts of `agentvm template` that take input: template names, --from, --packages,
// --copy, --env, an image's config (hostile: its JSON comes from the image), and writes into
// an image's tree that must stay inside it whatever symlinks the image holds.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "templates/image_delta.hpp"
#include "templates/image_source.hpp"
#include "templates/image_user.hpp"
#include "templates/rooted_tree.hpp"
#include "templates/template_build.hpp"
#include "templates/template_store.hpp"
#include "templates/tool.hpp"

using namespace agentvm;

namespace {

std::string error_of(const std::function<void()>& action)
{
    try {
        action();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

struct TempDir {
    std::filesystem::path path;
    TempDir()
    {
        std::string pattern = (std::filesystem::temp_directory_path() / "agentvm-unit-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()));
        path = pattern;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

std::string read(const std::filesystem::path& path)
{
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), {}};
}

} // namespace

TEST_CASE("template names are plain directory names")
{
    for (const char* good : {"swe", "a", "py3.11-slim", "x_y", "0abc"})
        CHECK(error_of([&] { check_template_name(good); }).empty());
    for (const char* bad : {"", "../x", "a/b", ".hidden", "-x", "UPPER", "sp ace", "a\nb"})
        CHECK(error_of([&] { check_template_name(bad); }).find("template name") != std::string::npos);
    CHECK(!error_of([&] { check_template_name(std::string(64, 'a')); }).empty());
}

TEST_CASE("--from names a transport and an existing path")
{
    TempDir dir;
    std::ofstream(dir.path / "image.tar") << "x";
    CHECK(parse_from("oci-archive:" + (dir.path / "image.tar").string()).kind == SourceKind::oci_archive);
    CHECK(parse_from("docker-archive:" + (dir.path / "image.tar").string()).kind == SourceKind::docker_archive);
    const TemplateSource layout = parse_from("oci:" + dir.path.string() + ":v1");
    CHECK(layout.kind == SourceKind::oci_layout);
    CHECK(layout.tag == "v1");
    CHECK(parse_from("dir:" + dir.path.string()).kind == SourceKind::dir);
    CHECK(error_of([&] { parse_from("tarball:/x"); }).find("unknown source") != std::string::npos);
    CHECK(error_of([&] { parse_from("oci-archive:"); }).find("expected") != std::string::npos);
    CHECK(error_of([&] { parse_from("oci-archive:/nonexistent/agentvm.tar"); }).find("/nonexistent/agentvm.tar")
          != std::string::npos);
    CHECK(error_of([&] { parse_from("dir:" + (dir.path / "image.tar").string()); }).find("not a directory")
          != std::string::npos);
}

TEST_CASE("--packages takes Debian package names only")
{
    const TemplateSource source = packages_source("git,g++,python3.11-venv", "http://mirror");
    CHECK(source.packages == std::vector<std::string>{"git", "g++", "python3.11-venv"});
    CHECK(source.text() == "packages:git,g++,python3.11-venv");
    for (const char* bad : {"", "git,", "Git", "a", "git;rm", "--force-yes", "git,,vim"})
        CHECK(error_of([&] { packages_source(bad, "http://mirror"); }).find("not a Debian package name")
              != std::string::npos);
}

TEST_CASE("--copy and --env are checked")
{
    TempDir dir;
    std::ofstream(dir.path / "f") << "x";
    const auto [from, to] = parse_copy((dir.path / "f").string() + ":/opt/f");
    CHECK(from == dir.path / "f");
    CHECK(to == "/opt/f");
    CHECK(error_of([&] { parse_copy((dir.path / "f").string() + ":opt"); }).find("absolute") != std::string::npos);
    CHECK(error_of([&] { parse_copy("/nonexistent-agentvm:/x"); }).find("does not exist") != std::string::npos);
    CHECK(error_of([&] { parse_copy("nocolon"); }).find("HOST_PATH:IMAGE_PATH") != std::string::npos);
    CHECK(error_of([&] { check_env_entry("A=1"); }).empty());
    CHECK(error_of([&] { check_env_entry("A="); }).empty());
    CHECK(error_of([&] { check_env_entry("=1"); }).find("KEY=VALUE") != std::string::npos);
    CHECK(error_of([&] { check_env_entry("NOEQ"); }).find("KEY=VALUE") != std::string::npos);
}

TEST_CASE("an image config is read with its types checked")
{
    const ImageConfig config = parse_image_config(
        R"({"architecture":"amd64","config":{"Env":["A=1","PATH=/bin"],"WorkingDir":"/w","User":"app"}})");
    CHECK(config.architecture == "amd64");
    CHECK(config.env == std::vector<std::string>{"A=1", "PATH=/bin"});
    CHECK(config.workdir == "/w");
    CHECK(config.user == "app");
    CHECK(parse_image_config(R"({"architecture":"arm64"})").env.empty());
    CHECK(parse_image_config(R"({"config":null})").workdir.empty());
    for (const char* bad : {"[]", "not json", R"({"config":[]})", R"({"config":{"Env":"A=1"}})",
                            R"({"config":{"Env":[1]}})", R"({"config":{"WorkingDir":5}})", R"({"architecture":1})"})
        CHECK_MESSAGE(!error_of([&] { parse_image_config(bad); }).empty(), bad);
}

TEST_CASE("writes into an image's tree stay inside it, whatever its symlinks say")
{
    TempDir host;
    const auto outside = host.path / "outside";
    const auto root = host.path / "root";
    std::filesystem::create_directories(outside);
    std::filesystem::create_directories(root / "etc");
    // What a hostile image could hold: links to the host's directories, absolute and relative.
    std::filesystem::create_directory_symlink(outside, root / "abs");
    std::filesystem::create_directory_symlink("../../outside", root / "etc" / "rel");
    std::filesystem::create_symlink(outside / "victim", root / "etc" / "leaf");
    const RootedTree tree(root);

    // A link whose target is missing inside the tree is an error, not a way out.
    CHECK(error_of([&] { tree.write_file("/abs/a", "1", 0644); }).find("No such file") != std::string::npos);
    CHECK(std::filesystem::is_empty(outside));
    std::filesystem::create_directories(root / outside.relative_path());
    std::filesystem::create_directories(root / "outside");

    tree.write_file("/abs/a", "1", 0644);
    tree.write_file("/etc/rel/b", "2", 0644);
    tree.make_dirs("/abs/deep/er", 0755);
    tree.write_file("/etc/leaf", "3", 0644);  // the link itself is replaced
    std::ofstream(host.path / "host-file") << "copied";
    tree.copy_in(host.path / "host-file", "/abs/copied");

    CHECK(std::filesystem::is_empty(outside));
    CHECK(read(root / outside.relative_path() / "a") == "1");
    CHECK(std::filesystem::exists(root / outside.relative_path() / "deep" / "er"));
    CHECK(read(root / outside.relative_path() / "copied") == "copied");
    CHECK(read(root / "outside" / "b") == "2");  // ../../outside from /etc climbs to the tree's root
    CHECK(!std::filesystem::is_symlink(root / "etc" / "leaf"));
    CHECK(read(root / "etc" / "leaf") == "3");
    CHECK(!std::filesystem::exists(outside / "victim"));
    CHECK(!error_of([&] { tree.write_file("relative", "x", 0644); }).empty());
    CHECK(!error_of([&] { tree.write_file("/etc/..", "x", 0644); }).empty());
}

TEST_CASE("an image's User resolves against its own /etc/passwd and /etc/group, as a container runtime does")
{
    const std::string passwd = "root:x:0:0:root:/root:/bin/sh\n"
                               "# a comment\n"
                               "broken line\n"
                               "app:x:1000:1000:App:/home/app:/bin/sh\n"
                               "nohome:x:1001:1002:::/bin/sh\n"
                               "bad:x:many:1:::\n";
    const std::string group = "root:x:0:\nwheel:x:10:app,other\napp:x:1000:\ndocker:x:999:other,app\nstaff:x:50:\n";

    const ResolvedUser app = resolve_image_user("app", passwd, group);
    CHECK(app.ids == ImageUser{1000, 1000, {10, 999}});
    CHECK(app.home == "/home/app");
    CHECK(resolve_image_user("1000", passwd, group).ids == ImageUser{1000, 1000, {10, 999}});
    // A group given is the only group.
    CHECK(resolve_image_user("app:staff", passwd, group).ids == ImageUser{1000, 50, {}});
    CHECK(resolve_image_user("app:77", passwd, group).ids == ImageUser{1000, 77, {}});
    CHECK(resolve_image_user("4242:staff", passwd, group).ids == ImageUser{4242, 50, {}});
    // A uid the image does not know: gid 0, home "/".
    const ResolvedUser unknown = resolve_image_user("4242", passwd, group);
    CHECK(unknown.ids == ImageUser{4242, 0, {}});
    CHECK(unknown.home == "/");
    CHECK(resolve_image_user("nohome", passwd, group).home == "/");
    CHECK(resolve_image_user("root", passwd, group).is_root());
    CHECK(resolve_image_user("0:0", "", "").is_root());
    CHECK(!resolve_image_user("0:50", passwd, group).is_root());

    CHECK(error_of([&] { resolve_image_user("ghost", passwd, group); }).find("no user 'ghost'") != std::string::npos);
    CHECK(error_of([&] { resolve_image_user("app:ghosts", passwd, group); }).find("no group 'ghosts'")
          != std::string::npos);
    CHECK(error_of([&] { resolve_image_user("bad", passwd, group); }).find("no user 'bad'") != std::string::npos);
    for (const char* spec : {":", "app:", ":staff"})
        CHECK_MESSAGE(error_of([&] { resolve_image_user(spec, passwd, group); }).find("expected USER") != std::string::npos,
                      std::string(spec));
    // (uid_t)-1 is no one: a name, then, and no such user.
    CHECK(!error_of([&] { resolve_image_user("4294967295", passwd, group); }).empty());
}

TEST_CASE("an image's files are read within its tree, regular files only, bounded")
{
    TempDir host;
    const auto root = host.path / "root";
    std::filesystem::create_directories(root / "etc");
    std::ofstream(host.path / "secret") << "host";
    std::filesystem::create_symlink(host.path / "secret", root / "etc" / "passwd");
    std::ofstream(root / "etc" / "group") << "0123456789";
    const RootedTree tree(root);
    CHECK(!tree.read_file("/etc/passwd", 100));  // the link leads to /secret in the tree: none
    CHECK(tree.read_file("/etc/group", 10) == "0123456789");
    CHECK(error_of([&] { tree.read_file("/etc/group", 9); }).find("larger than 9 bytes") != std::string::npos);
    CHECK(error_of([&] { tree.read_file("/etc", 100); }).find("not a regular file") != std::string::npos);
    CHECK(!tree.read_file("/etc/missing", 100));
    CHECK(tree.is_directory("/etc"));
    CHECK(!tree.is_directory("/etc/group"));
}

TEST_CASE("a tool's failure names the step and shows the end of what it said; a hung one is killed")
{
    CHECK(run_tool({"sh", "-c", "echo out"}, {.what = "echoing"}) == "out\n");
    const std::string failed =
        error_of([] { run_tool({"sh", "-c", "seq 1 500 >&2; exit 3"}, {.what = "counting"}); });
    CHECK(failed.find("counting failed: sh exited with status 3") != std::string::npos);
    CHECK(failed.find("\n500") != std::string::npos);
    CHECK(failed.find("\n100\n") == std::string::npos);  // only the tail
    const std::string hung = error_of([] {
        run_tool({"sh", "-c", "sleep 30 & sleep 30"}, {.what = "sleeping", .timeout = std::chrono::seconds(1)});
    });
    CHECK(hung.find("did not finish within 1 s") != std::string::npos);
    CHECK(error_of([] { run_tool({"sh", "-c", "head -c 2000 /dev/zero"}, {.what = "flooding", .max_stdout = 1000}); })
              .find("more than 1000 bytes") != std::string::npos);
    CHECK(error_of([] { require_tools({{"agentvm-no-such-tool", "some-package"}}); })
              .find("apt-get install some-package") != std::string::npos);
}

namespace {

void write_at(const std::filesystem::path& path, uint64_t offset, const std::string& bytes)
{
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
}

std::string read_at(const std::filesystem::path& path, uint64_t offset, size_t length)
{
    std::string bytes(length, '\0');
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::pread(fd, bytes.data(), length, static_cast<off_t>(offset)) == static_cast<ssize_t>(length));
    ::close(fd);
    return bytes;
}

void sparse_file(const std::filesystem::path& path, uint64_t size)
{
    std::ofstream(path).close();
    std::filesystem::resize_file(path, size);
}

} // namespace

TEST_CASE("a template's layer holds exactly the blocks its build changed in the base")
{
    TempDir dir;
    constexpr uint64_t mib = 1 << 20;
    const auto base = dir.path / "base.ext4";
    const auto image = dir.path / "image.ext4";
    sparse_file(base, 8 * mib);
    const std::string block_a(delta_block_bytes, 'a');
    write_at(base, 0, block_a + block_a);               // blocks 0-1: data in both, block 1 changed
    write_at(base, 3 * mib, block_a);                   // data only the base has: the image zeroes it
    std::filesystem::copy_file(base, image);
    write_at(image, delta_block_bytes + 7, "x");        // one byte of block 1
    write_at(image, 3 * mib, std::string(delta_block_bytes, '\0'));
    write_at(image, 5 * mib, block_a + block_a);        // data only the image has (a new file)
    write_at(image, 5 * mib + 2 * delta_block_bytes, std::string(delta_block_bytes, '\0'));  // zeros over a hole: same
    write_at(image, 8 * mib - delta_block_bytes, "end");  // the last block

    const auto layer = dir.path / "rootfs.layer";
    const ImageDelta delta = write_image_delta(base, image, layer);
    using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
    CHECK(delta.byte_ranges == Ranges{{delta_block_bytes, delta_block_bytes},
                                      {3 * mib, delta_block_bytes},
                                      {5 * mib, 2 * delta_block_bytes},
                                      {8 * mib - delta_block_bytes, delta_block_bytes}});
    CHECK(delta.bytes == 5 * delta_block_bytes);
    CHECK(std::filesystem::file_size(layer) == 8 * mib);
    for (const auto& [offset, length] : delta.byte_ranges)
        CHECK(read_at(layer, offset, length) == read_at(image, offset, length));
    struct stat st {};
    REQUIRE(::stat(layer.c_str(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_blocks) * 512 <= 64 * delta_block_bytes);  // sparse: the ranges, not the disk

    // The ranges round-trip through their file; a layer is never written over.
    const auto ranges_file = dir.path / "rootfs.layer.ranges";
    write_ranges_file(ranges_file, delta.byte_ranges);
    CHECK(read_ranges_file(ranges_file, 8 * mib) == delta.byte_ranges);
    CHECK_THROWS_AS(write_image_delta(base, image, layer), Error);

    // Images of different sizes are not a base and its copy.
    std::filesystem::resize_file(image, 4 * mib);
    CHECK(error_of([&] { write_image_delta(base, image, dir.path / "other.layer"); }).find("differ in size") !=
          std::string::npos);
}

TEST_CASE("a layer's ranges file that is not what a build wrote is refused, naming why")
{
    TempDir dir;
    const auto path = dir.path / "rootfs.layer.ranges";
    const auto refused = [&](const std::string& text, const std::string& why) {
        std::ofstream(path) << text;
        const std::string error = error_of([&] { read_ranges_file(path, 1 << 20); });
        CHECK_MESSAGE(error.find(why) != std::string::npos, text, " -> ", error);
    };
    refused("{}", "not a list");
    refused("[[0]]", "not [offset, length]");
    refused("[[0, -512]]", "not [offset, length]");
    refused("[[\"0\", 512]]", "not [offset, length]");
    refused("[[100, 512]]", "not whole sectors");
    refused("[[0, 0]]", "not whole sectors");
    refused("[[4096, 512], [0, 512]]", "out of order");
    refused("[[0, 512], [512, 512]]", "touches");
    refused("[[1048064, 1024]]", "leaves the");
    refused("[[18446744073709551104, 512]]", "leaves the");
    refused(std::string(100000, ' '), "more than ranges");
    std::ofstream(path) << "[[0, 512], [4096, 8192]]";
    CHECK(read_ranges_file(path, 1 << 20) == std::vector<std::pair<uint64_t, uint64_t>>{{0, 512}, {4096, 8192}});
}
