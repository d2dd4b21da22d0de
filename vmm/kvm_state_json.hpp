// The KVM state of a snapshot (vcpu_state.hpp, vm_kvm_state.hpp) as JSON values, to be stored
// as CBOR. KVM's own structs are kept as binary blobs in their UAPI layout (x86-64, little
// endian); MSRs as [index, value] pairs.
//
// Parsing takes untrusted input (a snapshot file), with core/state_codec's Fields: a value of
// the wrong type, a blob of the wrong size, a missing or unknown field, or more CPUID
// entries, MSRs or XSAVE bytes than a vCPU has is an Error("snapshot: <path>: <why>").
#pragma once

#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "vmm/vcpu_state.hpp"
#include "vmm/vm_kvm_state.hpp"

namespace agentvm {

nlohmann::json vcpu_state_to_json(const VcpuState& state);
VcpuState vcpu_state_from_json(const nlohmann::json& value, std::string_view path = "vcpu");

nlohmann::json vm_kvm_state_to_json(const VmKvmState& state);
VmKvmState vm_kvm_state_from_json(const nlohmann::json& value, std::string_view path = "vm");

} // namespace agentvm
