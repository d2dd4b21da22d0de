// The facades serve hosts, asked in the order they were added: the first that takes a
// request admits and answers it. The last one added takes whatever no other did, so every
// request has a facade to refuse it in a known shape.
#pragma once

#include <vector>

#include "service/facade.hpp"

namespace agentvm {

class Router {
public:
    // `facade` must outlive the router.
    void add(Facade& facade) { facades_.push_back(&facade); }
    // HttpServer::Options::admit.
    HttpServer::Admission admit(HttpExchange& head) const;

private:
    std::vector<Facade*> facades_;
};

} // namespace agentvm
