#include "service/metrics.hpp"

#include <fmt/format.h>

namespace agentvm {

std::string label(const std::string& name, const std::string& value)
{
    std::string escaped;
    for (char c : value) {
        if (c == '\\' || c == '"')
            escaped += '\\';
        if (c == '\n') {
            escaped += "\\n";
            continue;
        }
        escaped += c;
    }
    return fmt::format("{}=\"{}\"", name, escaped);
}

void Histogram::observe(double value)
{
    size_t bucket = 0;
    while (bucket < bounds_.size() && value > bounds_[bucket])
        ++bucket;
    if (bucket < bounds_.size())
        ++counts_[bucket];
    ++count_;
    sum_ += value;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& labels) const
{
    const std::string prefix = labels.empty() ? "" : labels + ",";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cumulative += counts_[i];
        out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, prefix, bounds_[i], cumulative);
    }
    out += fmt::format("{}_bucket{{{}le=\"+Inf\"}} {}\n", name, prefix, count_);
    const std::string braces = labels.empty() ? "" : "{" + labels + "}";
    out += fmt::format("{}_sum{} {}\n", name, braces, sum_);
    out += fmt::format("{}_count{} {}\n", name, braces, count_);
}

void MetricsText::family(const std::string& name, const std::string& type, const std::string& help)
{
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void MetricsText::sample(const std::string& name, const std::string& labels, double value)
{
    out_ += labels.empty() ? fmt::format("{} {}\n", name, value) : fmt::format("{}{{{}}} {}\n", name, labels, value);
}

void MetricsText::histogram(const std::string& name, const std::string& labels, const Histogram& histogram)
{
    histogram.write(out_, name, labels);
}

std::vector<double> latency_buckets()
{
    return {0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

} // namespace agentvm
