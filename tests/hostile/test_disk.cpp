// hostile tier, the guest against its own disk: filling it, deleting everything, raw writes to
// the block device. The attacks and what is checked after each are in hostile_check.py
// (group "disk").
#include <doctest/doctest.h>

#include "tests/hostile/hostile_test.hpp"

using namespace agentvm::test;

namespace {
const ProcessResult& run()
{
    return hostile_group("disk");
}
} // namespace

TEST_CASE("disk_fill: filling the disk ends in ENOSPC; the host overlay stays within the disk's size")
{
    check_attack(run(), "disk_fill");
}

TEST_CASE("rm_rf_root: rm -rf / leaves the agent serving and the next episode whole")
{
    check_attack(run(), "rm_rf_root");
}

TEST_CASE("raw_block_write: raw writes to /dev/vda harm only that episode, never the base image")
{
    check_attack(run(), "raw_block_write");
}

TEST_CASE("disk group: no failure, the bystander answered to the end")
{
    check_group_end(run());
}
