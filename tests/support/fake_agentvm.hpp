// A stand-in for the agentvm binary in unit tests of serve's parts: a shell script, removed at
// the end, whose BODY runs with the arguments agentvm would get.
#pragma once

#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace agentvm::test {

struct FakeAgentvm {
    std::string dir;
    std::string path;

    explicit FakeAgentvm(const std::string& body)
    {
        char name[] = "/tmp/agentvm-episode-test-XXXXXX";
        REQUIRE(::mkdtemp(name) != nullptr);
        dir = name;
        path = dir + "/agentvm";
        std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
        ::chmod(path.c_str(), 0755);
    }
    ~FakeAgentvm() { std::filesystem::remove_all(dir); }
};

} // namespace agentvm::test
