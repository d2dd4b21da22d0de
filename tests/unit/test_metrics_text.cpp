// /metrics' text: Prometheus exposition format lines, cumulative histogram buckets, escaped
// label values.
#include <doctest/doctest.h>

#include "service/metrics.hpp"

using namespace agentvm;

TEST_CASE("a histogram writes cumulative buckets, +Inf, sum and count")
{
    Histogram histogram({0.01, 0.1, 1});
    for (double v : {0.005, 0.05, 0.05, 5.0})
        histogram.observe(v);
    MetricsText out;
    out.family("x_seconds", "histogram", "test");
    out.histogram("x_seconds", label("pool", "p"), histogram);
    CHECK(out.text() == "# HELP x_seconds test\n# TYPE x_seconds histogram\n"
                        "x_seconds_bucket{pool=\"p\",le=\"0.01\"} 1\n"
                        "x_seconds_bucket{pool=\"p\",le=\"0.1\"} 3\n"
                        "x_seconds_bucket{pool=\"p\",le=\"1\"} 3\n"
                        "x_seconds_bucket{pool=\"p\",le=\"+Inf\"} 4\n"
                        "x_seconds_sum{pool=\"p\"} 5.105\n"
                        "x_seconds_count{pool=\"p\"} 4\n");
}

TEST_CASE("samples with and without labels; label values escaped")
{
    MetricsText out;
    out.sample("a_total", "", 3);
    out.sample("b", label("pool", "we\"ird\\pa\nth"), 1.5);
    CHECK(out.text() == "a_total 3\nb{pool=\"we\\\"ird\\\\pa\\nth\"} 1.5\n");
}
