#include "service/egress/name_resolver.hpp"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

namespace agentvm {

namespace {

Resolution lookup(const std::string& host)
{
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    // AI_ADDRCONFIG: no IPv6 answers on a host without IPv6 to reach them by.
    hints.ai_flags = AI_ADDRCONFIG;
    addrinfo* found = nullptr;
    Resolution out;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (rc != 0) {
        out.error = ::gai_strerror(rc);
        return out;
    }
    for (const addrinfo* a = found; a && out.addresses.size() < NameResolver::max_addresses; a = a->ai_next) {
        const auto address = IpAddress::from_sockaddr(a->ai_addr, a->ai_addrlen);
        if (address && std::find(out.addresses.begin(), out.addresses.end(), *address) == out.addresses.end())
            out.addresses.push_back(*address);
    }
    ::freeaddrinfo(found);
    if (out.addresses.empty())
        out.error = "no IPv4 or IPv6 address";
    return out;
}

} // namespace

void NameResolver::resolve(const std::string& host, Done done)
{
    if (workers_.empty()) {
        workers_.resize(threads);
        for (Worker& worker : workers_)
            worker.thread = std::make_unique<LoopWorker>(loop_, [] {});
    }
    Worker& worker = *std::min_element(workers_.begin(), workers_.end(),
                                       [](const Worker& a, const Worker& b) { return a.queued < b.queued; });
    ++worker.queued;
    auto result = std::make_shared<Resolution>();
    worker.thread->post([host, result] { *result = lookup(host); },
                        [&worker, result, done = std::move(done)](std::exception_ptr failure) {
                            --worker.queued;
                            if (failure) {
                                result->addresses.clear();
                                result->error = "the lookup did not run (serve is stopping)";
                            }
                            done(std::move(*result));
                        });
}

} // namespace agentvm
