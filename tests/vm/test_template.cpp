// agentvm template: images built from OCI/docker archives, an OCI layout, a Containerfile and
// Debian packages, a whiteout layer, a SWE-style task, hostile layers, and every bad input; then
// baked and run. The scenarios are in tests/vm/template_check.py: its host phase builds here
// (root and a loop mount, no KVM), its guest phase bakes and runs where a real guest boots.
#include <doctest/doctest.h>

#include <filesystem>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("agentvm template builds from the user's images, contains hostile ones, and runs episodes in them")
{
    // Under the build directory, which the test host shares with this host at the same path.
    const std::filesystem::path store = std::filesystem::path(VM_TEST_DIR) / "template-store";
    const std::filesystem::path work = std::filesystem::path(VM_TEST_DIR) / "template-work";
    std::filesystem::remove_all(store);
    std::filesystem::remove_all(work);
    std::filesystem::create_directories(work);

    const auto host = run_process({"python3", TEMPLATE_CHECK, "host", AGENTVM_BIN, store.string(), work.string()},
                                  std::chrono::seconds(1200));
    INFO("host phase stdout: " << host.out << "\nstderr: " << host.err);
    for (const char* name : {"busybox_from_archives", "unchanged_rebuild_is_cached", "whiteout_layer", "containerfile",
                             "swe_repository", "templates_share_their_base", "hostile_layers_contained", "sparse_file_refused",
                             "too_big_for_its_disk", "other_architecture", "corrupt_archive", "bad_input",
                             "failing_run_step_template", "list_and_rm"})
        CHECK_MESSAGE(host.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    REQUIRE(host.exit_code == 0);

    const auto guest = run_in_testhost({"python3", TEMPLATE_CHECK, "guest", AGENTVM_BIN, store.string(), work.string()},
                                       std::chrono::seconds(1500));
    INFO("guest phase stdout: " << guest.out << "\nstderr: " << guest.err);
    for (const char* name : {"busybox_runs_exec_and_shell", "containerfile_template_runs", "whiteout_applied",
                             "swe_task_passes_only_on_its_template", "hostile_image_contained_in_guest",
                             "failing_run_step_fails_bake", "python_client_and_serve_pool"})
        CHECK_MESSAGE(guest.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    CHECK(guest.exit_code == 0);

    // The Containerfile template's build lives on in buildah's storage until its rm.
    const auto rm = run_process({AGENTVM_BIN, "template", "rm", "cf", "--store", store.string()}, std::chrono::seconds(120));
    CHECK_MESSAGE(rm.exit_code == 0, rm.err);
    const auto images = run_process({"buildah", "images", "--noheading", "localhost/agentvm-template-cf"},
                                    std::chrono::seconds(60));
    CHECK_MESSAGE(images.out.empty(), images.out);
    std::filesystem::remove_all(store);
    std::filesystem::remove_all(work);
}
