// serve's counters and histograms, written in the Prometheus text exposition format
// (version 0.0.4) for GET /metrics (docs/api.md lists every series).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace agentvm {

// Labels as written inside the braces: name="value",... (values escaped by the caller's
// label() helper below).
std::string label(const std::string& name, const std::string& value);

class Histogram {
public:
    explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
    void observe(double value);
    // The _bucket, _sum and _count lines of one series.
    void write(std::string& out, const std::string& name, const std::string& labels) const;

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // per bucket, not cumulative
    uint64_t count_ = 0;
    double sum_ = 0;
};

class MetricsText {
public:
    // Starts a metric family: its # HELP and # TYPE lines.
    void family(const std::string& name, const std::string& type, const std::string& help);
    void sample(const std::string& name, const std::string& labels, double value);
    void histogram(const std::string& name, const std::string& labels, const Histogram& histogram);
    const std::string& text() const { return out_; }

private:
    std::string out_;
};

// Latency buckets in seconds, 1 ms to 2 minutes.
std::vector<double> latency_buckets();

} // namespace agentvm
