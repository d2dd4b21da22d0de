// What serve reads of a sandbox's VM from the host (service/sandbox_usage.hpp): its shape from a
// snapshot manifest, CPU time and resident memory from /proc texts, and CPU use as a share of
// its vCPUs between readings.
#include <doctest/doctest.h>

#include <unistd.h>

#include "service/sandbox_usage.hpp"

using namespace agentvm;

TEST_CASE("a manifest's VM shape")
{
    const auto shape = vm_shape_of_manifest(R"({"format":5,"vcpus":2,"mem_mib":512,"disk_bytes":717225984})");
    REQUIRE(shape);
    CHECK(shape->vcpus == 2);
    CHECK(shape->mem_mib == 512);
    CHECK(shape->disk_bytes == 717225984);
    CHECK(vm_shape_of_manifest(R"({"vcpus":1,"mem_mib":256})")->disk_bytes == 0);
    CHECK_FALSE(vm_shape_of_manifest("not json"));
    CHECK_FALSE(vm_shape_of_manifest(R"({"vcpus":-1,"mem_mib":256})"));
    CHECK_FALSE(vm_shape_of_manifest(R"({"mem_mib":256})"));
}

TEST_CASE("/proc texts: CPU time past a command name with spaces and parentheses, and VmRSS")
{
    const std::string stat = "1234 (agentvm (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
    CHECK(cpu_seconds_of_stat(stat, 100) == doctest::Approx(3.0));
    CHECK_FALSE(cpu_seconds_of_stat("1234 agentvm S 1", 100));
    CHECK_FALSE(cpu_seconds_of_stat("1234 (a) S 1 2", 100));
    CHECK(rss_bytes_of_status("Name:\tagentvm\nVmPeak:\t 100 kB\nVmRSS:\t    2048 kB\n") == 2048u * 1024);
    CHECK_FALSE(rss_bytes_of_status("Name:\tagentvm\n"));
    CHECK_FALSE(rss_bytes_of_status("VmRSS:\t lots kB\n"));
}

TEST_CASE("this process measures as a VM would: CPU time and resident memory")
{
    volatile unsigned spin = 0;
    for (unsigned i = 0; i < 20'000'000; ++i)
        spin = spin + i;
    const VmUsage usage = measure_vm(::getpid(), 0);
    CHECK(usage.cpu_seconds > 0);
    CHECK(usage.rss_bytes > 0);
    CHECK(usage.disk_used == 0);
}

TEST_CASE("CPU use between readings, as a share of the vCPUs")
{
    using namespace std::chrono_literals;
    CpuMeter meter;
    const CpuMeter::Clock::time_point start{};
    // One second of CPU over 2 s of a 1-vCPU VM since its start: 50 %.
    CHECK(meter.percent("sb-1", 1.0, 1, start, start + 2s) == doctest::Approx(50));
    // Then 2 s of CPU over the next 2 s of 2 vCPUs: 50 % again.
    CHECK(meter.percent("sb-1", 3.0, 2, start, start + 4s) == doctest::Approx(50));
    // Never past 100, never below 0; another sandbox counts from its own start.
    CHECK(meter.percent("sb-1", 10.0, 1, start, start + 5s) == doctest::Approx(100));
    CHECK(meter.percent("sb-2", 0.5, 1, start + 4s, start + 5s) == doctest::Approx(50));
}
