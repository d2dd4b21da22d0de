// An HTTP/1.1 server on our event loop, through libmicrohttpd (README, "Dependencies", says
// why that library): MHD parses and writes HTTP; this class drives it from the loop (its
// epoll fd watched, its timeout on a LoopTimer, no thread of its own) and turns its callbacks
// into one HttpExchange per request.
//
// Once a request's headers are whole, Options::admit (serve's Router) decides who answers it:
// the handler, the error shape, the body's limit and whether it streams, or a refusal at the
// door (authentication). The request reaches its handler once its body has arrived whole, at
// most max_body bytes (a Content-Length over it is answered 413 before the body is read), or,
// for a streamed body (file uploads), as soon as its headers have: its body then comes piece
// by piece, with backpressure, through read_body. The handler answers at once or later (the
// connection waits, suspended, costing no thread), with a whole body or a stream written
// piece by piece with backpressure.
//
// Connections are bounded (Options): in number, per listener and per client address, and in
// time, a request's headers being due header_timeout after the connection was accepted
// however slowly they trickle in. A request left waiting when serve stops is answered
// (finish_requests), and none is left suspended when MHD is stopped, which MHD would abort on.
//
// The handler's code runs inside MHD's callbacks (dispatch, body pieces, drained streams): an
// exception it lets out fails that request alone (HttpExchange::fail), never the loop.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/problem.hpp"

struct MHD_Daemon;
struct MHD_Connection;
struct MHD_UpgradeResponseHandle;

namespace agentvm {

class HttpServer;

// How a facade writes an error: the status and body of a refusal, and of an error the guest's
// agent answered a call with (docs/protocol.md's codes).
class ErrorWriter {
public:
    struct Answer {
        int status;
        std::string body;
        const char* content_type;
    };
    virtual ~ErrorWriter() = default;
    virtual Answer refusal(const Refusal& refusal) const = 0;
    virtual Answer agent_error(const std::string& code, const std::string& message) const = 0;
};

// One request and its answer. Lives until both the handler has let go of it and MHD has
// finished the request; gone() says the client went away first.
class HttpExchange {
public:
    const std::string& method() const { return method_; }
    const std::string& path() const { return path_; }
    const std::string& body() const { return body_; }
    // The request target as the client sent it: the path still percent-encoded, with its query.
    const std::string& target() const { return target_; }
    // Every request header, in the order they came (empty once gone()).
    std::vector<std::pair<std::string, std::string>> headers() const;
    // A request header or query argument, while the request runs (nullopt once gone()).
    std::optional<std::string> header(const char* name) const;
    std::optional<std::string> query(const char* name) const;
    // The password of HTTP Basic auth, when the request carries one.
    std::optional<std::string> basic_auth_password() const;
    // Whether the client came through a Unix socket (it then has no address and no browser).
    bool from_unix_socket() const;
    // MHD's connection under the request, for MHD's own helpers on it (its post processor,
    // which reads the boundary of a multipart/form-data body from the request's headers:
    // service/e2b/multipart_body.hpp); nullptr once gone().
    MHD_Connection* mhd_connection() const { return connection_; }

    // A header for the answer (respond, refuse or start_stream), set before it.
    void add_header(std::string name, std::string value) { extra_headers_.emplace_back(std::move(name), std::move(value)); }
    // The whole answer, once.
    void respond(int status, std::string body, const char* content_type = "application/json");
    // An error, in the shape of the request's facade, with Retry-After when the refusal has one.
    void refuse(const Refusal& refusal);
    void refuse(ServiceError code, const std::string& message) { refuse(Refusal{code, message, std::nullopt}); }
    // An error the guest's agent answered the request's call with.
    void respond_agent_error(const std::string& code, const std::string& message);

    // A streamed answer: start once, write pieces, then finish. buffered() is what the client
    // has not taken yet; on_drained runs (once per set) when it falls below low_water. With a
    // `size`, the answer says it as its Content-Length (and the stream must bring exactly that,
    // or be aborted); without, it is chunked. An empty content_type sends none.
    void start_stream(int status, const char* content_type, std::optional<uint64_t> size = std::nullopt);
    void write(std::string_view bytes);
    void finish();
    size_t buffered() const { return stream_.size() - stream_sent_; }
    void on_drained(size_t low_water, std::function<void()> callback);

    // Where the body streams (Options::streams_body): each piece goes to on_piece (valid
    // during the call), then on_end runs once the body is whole. Set by the handler before
    // it returns. pause_body() stops the pieces until resume_body().
    void read_body(std::function<void(std::string_view piece)> on_piece, std::function<void()> on_end);
    void pause_body() { body_paused_ = true; }
    void resume_body();
    // Answers 101 Switching Protocols (with the headers added, "Upgrade" among them) and hands
    // the connection over once it is sent: on_upgraded gets the socket (non-blocking, never to
    // be closed but through `close`) and the bytes the client sent after its request head, and
    // returns what serve calls to end the connection when serve stops first.
    struct UpgradedSocket {
        int fd = -1;
        std::string early;
        std::function<void()> close;
    };
    using OnUpgraded = std::function<std::function<void()>(UpgradedSocket)>;
    void upgrade(OnUpgraded on_upgraded);

    // Ends a streamed answer as failed: once the client has taken what was written, the
    // connection is closed without the stream's end, so the client sees the body is incomplete.
    void abort();

    // Ends the request after a failure of serve's own, logged: "internal" when nothing was
    // answered yet, else the stream is cut (abort).
    void fail(const std::exception& error);

    bool answered() const { return answered_; }
    bool gone() const { return gone_; }
    // Whether the client has closed its end while its request waited: a suspended connection
    // is not watched, so gone() learns of that only when the answer cannot be sent. Asked of
    // the socket itself (a hang-up or the peer's shutdown), for an answer that would be lost.
    bool client_closed() const;
    // Runs once when the client goes away before the answer was sent whole.
    void on_gone(std::function<void()> callback) { on_gone_ = std::move(callback); }
    // While the request waits unanswered, its client closing its end is noticed within about
    // a second (the server's sweep asks the socket): on_gone runs then, and the request ends.
    // For a request whose wait holds something of the guest's (a connection being made).
    void watch_client() { watch_client_ = true; }

private:
    friend class HttpServer;
    friend struct HttpCallbacks;
    struct Answer {
        int status = 0;
        std::string body;
        std::string content_type;
        std::optional<int> retry_after_s;
        bool streamed = false;
        bool upgrade = false;
        std::optional<uint64_t> size;  // a streamed answer's, when known
    };

    HttpExchange(HttpServer& server, MHD_Connection* connection, std::string method, std::string path)
        : server_(&server), connection_(connection), method_(std::move(method)), path_(std::move(path))
    {
    }
    // Suspends the connection until wake(). Never twice: MHD 0.9.75 keeps calling the request
    // handler with a chunked body's next chunk after the handler suspended (process_request_body
    // loops per chunk), and suspending a suspended connection corrupts MHD's connection lists.
    void park();
    void wake();
    void respond_with(const ErrorWriter::Answer& answer, std::optional<int> retry_after_s);
    long read_stream(uint64_t pos, char* buffer, size_t max);

    HttpServer* server_;
    MHD_Connection* connection_;
    std::string method_;
    std::string path_;
    std::string target_;
    std::string body_;
    OnUpgraded on_upgraded_;
    const ErrorWriter* errors_ = nullptr;  // the facade's, from admission
    std::function<void(const std::shared_ptr<HttpExchange>&)> handler_;
    bool body_too_large_ = false;
    size_t max_body_ = 0;
    bool body_streams_ = false;
    bool body_paused_ = false;
    bool body_ended_ = false;
    uint64_t body_dropped_ = 0;  // streamed body that came after the answer, read and dropped
    std::function<void(std::string_view)> on_body_piece_;
    std::function<void()> on_body_end_;
    bool dispatched_ = false;
    bool suspended_ = false;
    bool queued_ = false;
    bool answered_ = false;
    bool gone_ = false;
    bool watch_client_ = false;
    std::optional<Answer> answer_;
    std::vector<std::pair<std::string, std::string>> extra_headers_;
    std::string stream_;        // streamed bytes; the sent prefix is dropped now and then
    size_t stream_sent_ = 0;
    bool stream_finished_ = false;
    bool stream_aborted_ = false;
    size_t low_water_ = 0;
    std::function<void()> on_drained_;
    std::function<void()> on_gone_;
};

// Runs handler code where an exception must not leave (MHD's callbacks, a sandbox's line
// reader): one it lets out fails this request alone (HttpExchange::fail). Thrown on to the
// event loop, it would end serve and every sandbox with it.
template <typename Code>
void guard_request(HttpExchange& exchange, Code&& code)
{
    try {
        code();
    } catch (const std::exception& e) {
        exchange.fail(e);
    }
}

class HttpServer {
public:
    using Handler = std::function<void(const std::shared_ptr<HttpExchange>&)>;

    // Who answers a request, decided from its head (method, path, headers) alone.
    struct Admission {
        const ErrorWriter* errors = nullptr;  // must outlive the server
        Handler handler;
        size_t max_body = size_t{1} << 20;
        bool streams_body = false;      // handed over as it arrives (read_body), no max_body
        std::optional<Refusal> refusal;  // refused at the door: answered, never handled
    };

    struct Options {
        std::function<Admission(HttpExchange& head)> admit;
        // Connections open at once, over all listeners (each listener gets its share, so a
        // flood on one leaves the others served); past it a new one is closed at once.
        // serve sizes it from its descriptor limit (serve.cpp, connection_budget).
        unsigned max_connections = 1024;
        // Connections open at once from one IP address on a TCP listener (0: no limit). A
        // Unix socket's clients have no address: MHD lets them through whatever this says.
        unsigned max_connections_per_address = 0;
        // A connection that sends or takes nothing for this long is closed (while its
        // request waits for a suspended answer, it is not counted).
        std::chrono::seconds idle_timeout{60};
        // A request's headers must be whole this long after the connection was accepted,
        // however slowly they trickle in (the idle timeout is reset by every byte). On a
        // kept-alive connection the next request's headers must be whole idle_timeout after
        // the previous answer.
        std::chrono::seconds header_timeout{10};
    };

    // Serves on each listening socket (already bound and listening; see listen_unix and
    // listen_tcp) until destroyed.
    HttpServer(EventLoop& loop, std::vector<Fd> listeners, Options options);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Stops accepting connections; requests already running go on.
    void stop_accepting();
    // serve is stopping and its VMs have ended: stops accepting, answers every request still
    // unanswered with 503 "shutting_down" and runs `done` once every request has finished
    // (its answer sent, or its client gone). What is still open when the server is
    // destroyed is closed then.
    void finish_requests(std::function<void()> done);

private:
    friend class HttpExchange;
    // MHD in external-epoll mode only acts on a resumed connection when it next runs: the
    // next turn of the loop runs it.
    void run_soon();
    struct Daemon;

    friend struct HttpCallbacks;

    void run_daemon(Daemon& daemon);
    // Upgraded connections still open, with what ends each (its owner's stop).
    void upgraded(MHD_UpgradeResponseHandle* handle, std::function<void()> stop);
    void close_upgraded(MHD_UpgradeResponseHandle* handle);
    void stop_upgraded();
    // Connection tracking, for the header deadline (MHD_OPTION_NOTIFY_CONNECTION).
    struct Connection;
    void connection_started(MHD_Connection* connection, void** socket_context);
    void connection_closed(void** socket_context);
    static Connection* connection_of(MHD_Connection* connection);
    void sweep_deadlines();
    void request_finished();
    bool handle(MHD_Connection* connection, const char* url, const char* method, const char* upload_data,
               size_t* upload_data_size, void** context);
    void admit(HttpExchange& exchange);
    // 501 for a body MHD cannot delimit, 413 for a Content-Length over the admitted limit.
    void refuse_unreadable_body(HttpExchange& exchange);
    bool queue(HttpExchange& exchange);
    void dispatch(const std::shared_ptr<HttpExchange>& exchange);
    bool answer_or_wait(HttpExchange& exchange);
    bool take_streamed_body(HttpExchange& exchange, const char* data, size_t* size);

    EventLoop& loop_;
    Options options_;
    std::vector<std::unique_ptr<Daemon>> daemons_;
    // Every open connection, and every request MHD has not finished yet (suspended ones
    // included: MHD_stop_daemon aborts the process if one is left suspended).
    std::set<Connection*> connections_;
    std::set<HttpExchange*> requests_;
    std::optional<LoopTimer> deadline_timer_;
    std::function<void()> finished_;  // finish_requests' done, until requests_ is empty
    std::map<MHD_UpgradeResponseHandle*, std::function<void()>> upgraded_;
    // An upgraded connection's close may come after the server is gone: it asks this first.
    std::shared_ptr<HttpServer*> alive_ = std::make_shared<HttpServer*>(this);
};

// A Unix socket listening at `path` with mode 0600 (a stale socket file there is replaced).
Fd listen_unix(const std::string& path);
// A TCP socket listening on host:port (numeric IPv4 or IPv6 host; "localhost" is 127.0.0.1).
Fd listen_tcp(const std::string& host, uint16_t port);

} // namespace agentvm
