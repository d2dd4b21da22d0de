#include "service/http_server.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <strings.h>
#include <unistd.h>

#include <microhttpd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

namespace {

// Streamed bytes already sent are dropped from the buffer once they are this many.
constexpr size_t stream_compact_bytes = 256 * 1024;
// What MHD keeps per connection (request headers included): a header block larger than this
// is refused with 431 by MHD. 16 KiB halves the default's memory per idle connection.
constexpr size_t connection_memory = 16 * 1024;
// How often connections are checked against their header deadline.
constexpr auto deadline_sweep_period = std::chrono::seconds(1);
// A streamed body answered before it ended (an upload whose sandbox ended) is read and
// dropped up to this much, so that its answer can be sent once it is whole (MHD queues an
// answer only before the body or after it); a longer rest closes the connection instead.
constexpr uint64_t max_body_dropped = uint64_t{64} << 20;

} // namespace

struct HttpServer::Daemon {
    MHD_Daemon* mhd = nullptr;
    int epoll_fd = -1;
    std::optional<LoopTimer> timer;
    bool accepting = true;
};

struct HttpServer::Connection {
    int fd = -1;
    // When the next request's headers must be whole; none while a request runs.
    std::optional<std::chrono::steady_clock::time_point> headers_due;
    bool cut = false;  // closed for missing its deadline (shut down; MHD closes it)
    std::string target;  // the request line's target, as sent (MHD_OPTION_URI_LOG_CALLBACK)
};

// MHD's callbacks, with the exact types it calls them with.
struct HttpCallbacks {
    static MHD_Result request(void* self, MHD_Connection* connection, const char* url, const char* method,
                              const char* /*version*/, const char* upload_data, size_t* upload_data_size,
                              void** context)
    {
        return static_cast<HttpServer*>(self)->handle(connection, url, method, upload_data, upload_data_size,
                                                      context)
            ? MHD_YES
            : MHD_NO;
    }

    static void completed(void* self, MHD_Connection* connection, void** context, MHD_RequestTerminationCode how)
    {
        auto* held = static_cast<std::shared_ptr<HttpExchange>*>(*context);
        if (!held)
            return;
        HttpExchange& exchange = **held;
        if (HttpServer::Connection* tracked = HttpServer::connection_of(connection))
            tracked->headers_due = std::chrono::steady_clock::now() + exchange.server_->options_.idle_timeout;
        static_cast<HttpServer*>(self)->requests_.erase(&exchange);
        exchange.connection_ = nullptr;
        exchange.gone_ = true;
        const bool whole = how == MHD_REQUEST_TERMINATED_COMPLETED_OK;
        auto on_gone = std::move(exchange.on_gone_);
        exchange.on_drained_ = nullptr;
        exchange.on_body_piece_ = nullptr;  // they may hold the exchange (an upload does)
        exchange.on_body_end_ = nullptr;
        delete held;
        *context = nullptr;
        if (!whole && on_gone) {
            try {
                on_gone();
            } catch (const std::exception& e) {
                spdlog::error("http: after the client went away: {}", e.what());
            }
        }
        static_cast<HttpServer*>(self)->request_finished();
    }

    static void notify_connection(void* self, MHD_Connection* connection, void** socket_context,
                                  MHD_ConnectionNotificationCode what)
    {
        auto* server = static_cast<HttpServer*>(self);
        if (what == MHD_CONNECTION_NOTIFY_STARTED)
            server->connection_started(connection, socket_context);
        else if (what == MHD_CONNECTION_NOTIFY_CLOSED)
            server->connection_closed(socket_context);
    }

    // Called with the raw target before MHD decodes it; what it returns would become the
    // request's context, which must start null (handle() tells a new request by it).
    static void* uri_seen(void* /*self*/, const char* uri, MHD_Connection* connection)
    {
        if (HttpServer::Connection* tracked = HttpServer::connection_of(connection))
            tracked->target = uri ? uri : "";
        return nullptr;
    }

    static void upgraded(void* cls, MHD_Connection* /*connection*/, void* /*context*/, const char* extra_in,
                         size_t extra_in_size, MHD_socket sock, MHD_UpgradeResponseHandle* handle)
    {
        auto* exchange = static_cast<HttpExchange*>(cls);
        HttpServer* server = exchange->server_;
        auto on_upgraded = std::move(exchange->on_upgraded_);
        exchange->on_upgraded_ = nullptr;
        std::weak_ptr<HttpServer*> alive = server->alive_;
        HttpExchange::UpgradedSocket socket{sock, std::string(extra_in ? extra_in : "", extra_in_size),
                                            [alive, handle] {
                                                if (auto server_alive = alive.lock())
                                                    (*server_alive)->close_upgraded(handle);
                                            }};
        std::function<void()> stop;
        try {
            if (on_upgraded)
                stop = on_upgraded(std::move(socket));
        } catch (const std::exception& e) {
            spdlog::error("http: {} {}: after the upgrade: {}", exchange->method_, exchange->path_, e.what());
        }
        if (!stop) {
            // Nobody took the connection: it is closed at once.
            MHD_upgrade_action(handle, MHD_UPGRADE_ACTION_CLOSE);
            server->run_soon();
            return;
        }
        server->upgraded(handle, std::move(stop));
    }

    static ssize_t read_stream(void* cls, uint64_t pos, char* buffer, size_t max)
    {
        return static_cast<HttpExchange*>(cls)->read_stream(pos, buffer, max);
    }

    static void log(void* /*cls*/, const char* format, va_list args)
    {
        char line[512];
        std::vsnprintf(line, sizeof line, format, args);
        std::string text(line);
        while (!text.empty() && text.back() == '\n')
            text.pop_back();
        spdlog::debug("http: {}", text);
    }
};

std::optional<std::string> HttpExchange::header(const char* name) const
{
    if (!connection_)
        return std::nullopt;
    const char* value = MHD_lookup_connection_value(connection_, MHD_HEADER_KIND, name);
    return value ? std::optional<std::string>(value) : std::nullopt;
}

std::vector<std::pair<std::string, std::string>> HttpExchange::headers() const
{
    std::vector<std::pair<std::string, std::string>> out;
    if (!connection_)
        return out;
    MHD_get_connection_values(
        connection_, MHD_HEADER_KIND,
        [](void* cls, MHD_ValueKind, const char* key, const char* value) -> MHD_Result {
            static_cast<std::vector<std::pair<std::string, std::string>>*>(cls)->emplace_back(key ? key : "",
                                                                                              value ? value : "");
            return MHD_YES;
        },
        &out);
    return out;
}

void HttpExchange::upgrade(OnUpgraded on_upgraded)
{
    if (answered_)
        return;
    answered_ = true;
    on_upgraded_ = std::move(on_upgraded);
    answer_ = Answer{101, {}, {}, std::nullopt, false, true, std::nullopt};
    wake();
}

std::optional<std::string> HttpExchange::query(const char* name) const
{
    if (!connection_)
        return std::nullopt;
    const char* value = MHD_lookup_connection_value(connection_, MHD_GET_ARGUMENT_KIND, name);
    return value ? std::optional<std::string>(value) : std::nullopt;
}

void HttpExchange::respond(int status, std::string body, const char* content_type)
{
    if (answered_)
        return;
    answered_ = true;
    answer_ = Answer{status, std::move(body), content_type, std::nullopt, false, false, std::nullopt};
    wake();
}

std::optional<std::string> HttpExchange::basic_auth_password() const
{
    if (!connection_)
        return std::nullopt;
    char* password = nullptr;
    char* user = MHD_basic_auth_get_username_password(connection_, &password);
    std::optional<std::string> out = password ? std::optional<std::string>(password) : std::nullopt;
    MHD_free(user);
    MHD_free(password);
    return out;
}

bool HttpExchange::from_unix_socket() const
{
    if (!connection_)
        return false;
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection_, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    return info && info->client_addr && info->client_addr->sa_family == AF_UNIX;
}

void HttpExchange::respond_with(const ErrorWriter::Answer& answer, std::optional<int> retry_after_s)
{
    if (answered_)
        return;
    answered_ = true;
    answer_ = Answer{answer.status, answer.body, answer.content_type, retry_after_s, false, false, std::nullopt};
    wake();
}

void HttpExchange::refuse(const Refusal& refusal)
{
    if (!errors_) {  // only a request that failed before its admission
        respond(500, "internal error\n", "text/plain");
        return;
    }
    ErrorWriter::Answer answer = errors_->refusal(refusal);
    // Behind a fleet's front door (docs/fleet.md), which marks what it balances with
    // Agentvm-Front-Door: a create this node has no room for is answered 503, which HAProxy
    // retries on another node (it retries no 429), naming the refusal so that HAProxy answers
    // 429 again when every node it tried was full.
    if (refusal.code == ServiceError::at_capacity && header("Agentvm-Front-Door")) {
        answer.status = 503;
        add_header("Agentvm-Refusal", std::string(error_name(refusal.code)));
    }
    respond_with(answer, refusal.retry_after_s);
}

void HttpExchange::respond_agent_error(const std::string& code, const std::string& message)
{
    if (!errors_) {
        respond(500, "internal error\n", "text/plain");
        return;
    }
    respond_with(errors_->agent_error(code, message), std::nullopt);
}

void HttpExchange::fail(const std::exception& error)
{
    spdlog::error("http: {} {}: {}", method_, path_, error.what());
    if (answered_)
        abort();
    else
        refuse(ServiceError::internal, error.what());
}

void HttpExchange::start_stream(int status, const char* content_type, std::optional<uint64_t> size)
{
    if (answered_)
        return;
    answered_ = true;
    answer_ = Answer{status, {}, content_type, std::nullopt, true, false, size};
    wake();
}

void HttpExchange::write(std::string_view bytes)
{
    if (gone_ || stream_finished_ || bytes.empty())
        return;
    stream_.append(bytes);
    wake();
}

void HttpExchange::finish()
{
    if (gone_ || stream_finished_)
        return;
    stream_finished_ = true;
    wake();
}

void HttpExchange::on_drained(size_t low_water, std::function<void()> callback)
{
    low_water_ = low_water;
    on_drained_ = std::move(callback);
}

void HttpExchange::read_body(std::function<void(std::string_view)> on_piece, std::function<void()> on_end)
{
    on_body_piece_ = std::move(on_piece);
    on_body_end_ = std::move(on_end);
}

bool HttpExchange::client_closed() const
{
    if (gone_ || !connection_)
        return true;
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection_, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info)
        return false;
    pollfd p{info->connect_fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void HttpExchange::resume_body()
{
    body_paused_ = false;
    wake();
}

void HttpExchange::abort()
{
    if (gone_ || stream_finished_)
        return;
    stream_aborted_ = true;
    wake();
}

void HttpExchange::park()
{
    if (suspended_ || !connection_)
        return;
    suspended_ = true;
    MHD_suspend_connection(connection_);
}

void HttpExchange::wake()
{
    if (connection_ && suspended_) {
        suspended_ = false;
        MHD_resume_connection(connection_);
        server_->run_soon();
    }
}

long HttpExchange::read_stream(uint64_t /*pos*/, char* buffer, size_t max)
{
    const size_t ready = stream_.size() - stream_sent_;
    if (ready == 0 && stream_aborted_)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (ready == 0) {
        if (stream_finished_)
            return MHD_CONTENT_READER_END_OF_STREAM;
        // Nothing yet: park the connection until write() or finish() wakes it (returning 0
        // without suspending would have MHD call again at once, spinning).
        park();
        return 0;
    }
    const size_t n = std::min(ready, max);
    std::memcpy(buffer, stream_.data() + stream_sent_, n);
    stream_sent_ += n;
    if (stream_sent_ >= stream_compact_bytes) {
        stream_.erase(0, stream_sent_);
        stream_sent_ = 0;
    }
    if (on_drained_ && buffered() < low_water_) {
        auto callback = std::move(on_drained_);
        on_drained_ = nullptr;
        guard_request(*this, callback);
    }
    return static_cast<long>(n);
}

HttpServer::HttpServer(EventLoop& loop, std::vector<Fd> listeners, Options options)
    : loop_(loop), options_(std::move(options))
{
    deadline_timer_.emplace(loop_, [this] { sweep_deadlines(); });
    // Each listener its share: a flood of connections on one leaves the others served.
    const unsigned share =
        std::max(1u, options_.max_connections / static_cast<unsigned>(std::max<size_t>(listeners.size(), 1)));
    for (Fd& listener : listeners) {
        sockaddr_storage bound{};
        socklen_t bound_length = sizeof bound;
        const bool unix_socket = ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &bound_length) == 0
                                 && bound.ss_family == AF_UNIX;
        auto daemon = std::make_unique<Daemon>();
        const int fd = listener.release();
        daemon->mhd = MHD_start_daemon(
            MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0,
            nullptr, nullptr,
            &HttpCallbacks::request, this,
            MHD_OPTION_EXTERNAL_LOGGER, &HttpCallbacks::log, nullptr,  // first, or MHD logs to stderr
            MHD_OPTION_LISTEN_SOCKET, fd,
            MHD_OPTION_NOTIFY_COMPLETED, &HttpCallbacks::completed, this,
            MHD_OPTION_NOTIFY_CONNECTION, &HttpCallbacks::notify_connection, this,
            MHD_OPTION_URI_LOG_CALLBACK, &HttpCallbacks::uri_seen, this,
            MHD_OPTION_CONNECTION_LIMIT, share,
            // MHD would let a Unix socket's clients through anyway (they have no address),
            // but could mistake a bound client's path of the right length for one.
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, unix_socket ? 0u : options_.max_connections_per_address,
            MHD_OPTION_CONNECTION_TIMEOUT, static_cast<unsigned>(options_.idle_timeout.count()),
            MHD_OPTION_CONNECTION_MEMORY_LIMIT, connection_memory,
            MHD_OPTION_END);
        if (!daemon->mhd) {
            ::close(fd);
            throw Error("starting the HTTP server failed (libmicrohttpd refused the listening socket)");
        }
        const MHD_DaemonInfo* info = MHD_get_daemon_info(daemon->mhd, MHD_DAEMON_INFO_EPOLL_FD);
        daemon->epoll_fd = info->epoll_fd;
        Daemon& d = *daemon;
        daemon->timer.emplace(loop_, [this, &d] { run_daemon(d); });
        loop_.watch_readable(daemon->epoll_fd, [this, &d] { run_daemon(d); });
        daemons_.push_back(std::move(daemon));
        run_daemon(d);
    }
}

HttpServer::~HttpServer()
{
    finished_ = nullptr;
    stop_upgraded();
    alive_.reset();
    // MHD_stop_daemon aborts the process if a connection is still suspended: every request
    // waiting for its answer is resumed first, and closed unanswered with the rest.
    for (HttpExchange* exchange : requests_) {
        if (exchange->suspended_ && exchange->connection_) {
            exchange->suspended_ = false;
            MHD_resume_connection(exchange->connection_);
        }
    }
    for (auto& daemon : daemons_) {
        loop_.unwatch(daemon->epoll_fd);
        MHD_stop_daemon(daemon->mhd);
    }
    // After every daemon: a request closed by one may wake one of another's (run_soon).
    for (auto& daemon : daemons_)
        daemon->timer.reset();
    deadline_timer_.reset();
}

void HttpServer::stop_accepting()
{
    for (auto& daemon : daemons_) {
        if (!daemon->accepting)
            continue;
        daemon->accepting = false;
        const MHD_socket listener = MHD_quiesce_daemon(daemon->mhd);
        if (listener != MHD_INVALID_SOCKET)
            ::close(listener);
    }
}

void HttpServer::upgraded(MHD_UpgradeResponseHandle* handle, std::function<void()> stop)
{
    upgraded_[handle] = std::move(stop);
}

void HttpServer::close_upgraded(MHD_UpgradeResponseHandle* handle)
{
    if (upgraded_.erase(handle) == 0)
        return;
    MHD_upgrade_action(handle, MHD_UPGRADE_ACTION_CLOSE);
    run_soon();
}

void HttpServer::stop_upgraded()
{
    // Each owner's stop closes its connection through close_upgraded; one that does not is
    // closed here all the same, since MHD must not stop with an upgraded connection open.
    while (!upgraded_.empty()) {
        const auto first = upgraded_.begin();
        MHD_UpgradeResponseHandle* handle = first->first;
        auto stop = std::move(first->second);
        first->second = nullptr;
        try {
            if (stop)
                stop();
        } catch (const std::exception& e) {
            spdlog::error("http: stopping an upgraded connection: {}", e.what());
        }
        close_upgraded(handle);
    }
}

void HttpServer::finish_requests(std::function<void()> done)
{
    stop_accepting();
    stop_upgraded();
    finished_ = std::move(done);
    const std::vector<HttpExchange*> open(requests_.begin(), requests_.end());
    for (HttpExchange* exchange : open) {
        if (!exchange->answered_)
            exchange->refuse(ServiceError::shutting_down, "serve is stopping");
    }
    request_finished();
}

void HttpServer::request_finished()
{
    if (!finished_ || !requests_.empty())
        return;
    auto done = std::move(finished_);
    finished_ = nullptr;
    done();
}

void HttpServer::run_soon()
{
    for (auto& daemon : daemons_)
        if (daemon->timer)
            daemon->timer->arm(std::chrono::nanoseconds(1));
}

void HttpServer::connection_started(MHD_Connection* connection, void** socket_context)
{
    auto tracked = std::make_unique<Connection>();
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    tracked->fd = info ? info->connect_fd : -1;
    tracked->headers_due = std::chrono::steady_clock::now() + options_.header_timeout;
    if (connections_.empty())
        deadline_timer_->arm(deadline_sweep_period);
    connections_.insert(tracked.get());
    *socket_context = tracked.release();
}

void HttpServer::connection_closed(void** socket_context)
{
    auto* tracked = static_cast<Connection*>(*socket_context);
    if (!tracked)
        return;
    connections_.erase(tracked);
    delete tracked;
    *socket_context = nullptr;
}

HttpServer::Connection* HttpServer::connection_of(MHD_Connection* connection)
{
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? static_cast<Connection*>(info->socket_context) : nullptr;
}

void HttpServer::sweep_deadlines()
{
    // MHD's own timeout is reset by every byte, so a client that trickles its headers a byte
    // at a time would hold its connection (and a descriptor) for ever: this deadline is not.
    // The socket is shut down rather than closed: MHD owns it, sees the end and closes it.
    const auto now = std::chrono::steady_clock::now();
    size_t cut = 0;
    for (Connection* tracked : connections_) {
        if (tracked->cut || !tracked->headers_due || now < *tracked->headers_due || tracked->fd < 0)
            continue;
        tracked->cut = true;
        ::shutdown(tracked->fd, SHUT_RDWR);
        ++cut;
    }
    if (cut > 0) {
        spdlog::debug("http: closed {} connection(s) whose request headers were not whole in time", cut);
        run_soon();
    }
    // A stream parked for want of bytes is not watched by MHD: a client that left one whose
    // source is silent (an attach to a quiet process, a watch) would be noticed only at the
    // next byte, perhaps never. Ended here, its on_gone runs and its call is let go.
    const std::vector<HttpExchange*> open(requests_.begin(), requests_.end());
    for (HttpExchange* exchange : open) {
        if (exchange->suspended_ && exchange->answer_ && exchange->answer_->streamed && !exchange->stream_finished_
            && exchange->client_closed())
            exchange->abort();
        // Likewise a request that asked for it, still unanswered: it ends, unanswered but for
        // MHD's sake (a suspended connection is only closed once resumed with an answer).
        if (exchange->suspended_ && !exchange->answer_ && exchange->watch_client_ && exchange->client_closed()) {
            if (auto on_gone = std::exchange(exchange->on_gone_, nullptr))
                guard_request(*exchange, on_gone);
            if (!exchange->answer_)
                exchange->respond(499, "", "text/plain");
        }
    }
    if (!connections_.empty())
        deadline_timer_->arm(deadline_sweep_period);
}

void HttpServer::run_daemon(Daemon& daemon)
{
    MHD_run(daemon.mhd);
    MHD_UNSIGNED_LONG_LONG timeout_ms = 0;
    if (MHD_get_timeout(daemon.mhd, &timeout_ms) == MHD_YES)
        daemon.timer->arm(std::chrono::milliseconds(timeout_ms));
    else
        daemon.timer->cancel();
}

void HttpServer::admit(HttpExchange& exchange)
{
    Admission admission = options_.admit(exchange);
    exchange.errors_ = admission.errors;
    exchange.handler_ = std::move(admission.handler);
    exchange.max_body_ = admission.max_body;
    exchange.body_streams_ = admission.streams_body;
    if (admission.refusal)
        exchange.refuse(*admission.refusal);
}

bool HttpServer::handle(MHD_Connection* connection, const char* url, const char* method, const char* upload_data,
                        size_t* upload_data_size, void** context)
{
    auto* held = static_cast<std::shared_ptr<HttpExchange>*>(*context);
    if (!held) {
        held = new std::shared_ptr<HttpExchange>(new HttpExchange(*this, connection, method, url));
        *context = held;
        HttpExchange& exchange = **held;
        requests_.insert(&exchange);
        if (Connection* tracked = connection_of(connection)) {
            tracked->headers_due.reset();  // the headers are whole
            exchange.target_ = std::move(tracked->target);
            tracked->target.clear();
        }
        guard_request(exchange, [&] { admit(exchange); });
        if (!exchange.answer_)
            refuse_unreadable_body(exchange);
        // Answered already (401, 413, 501): queued now, so MHD closes the connection after it
        // instead of reading a body nobody wants.
        if (!exchange.answer_ && exchange.body_streams_)
            dispatch(*held);
        if (exchange.answer_)
            return queue(exchange);
        return true;
    }
    HttpExchange& exchange = **held;
    if (exchange.queued_) {
        *upload_data_size = 0;
        return true;
    }
    if (exchange.body_streams_)
        return take_streamed_body(exchange, upload_data, upload_data_size);
    if (*upload_data_size > 0) {
        if (exchange.body_.size() + *upload_data_size > exchange.max_body_)
            exchange.body_too_large_ = true;
        else
            exchange.body_.append(upload_data, *upload_data_size);
        *upload_data_size = 0;
        return true;
    }
    if (!exchange.dispatched_ && !exchange.answer_) {  // answered already: serve is stopping
        exchange.dispatched_ = true;
        if (exchange.body_too_large_) {
            exchange.refuse(ServiceError::body_too_large,
                            fmt::format("the request body is over {} bytes", exchange.max_body_));
        } else {
            dispatch(*held);
        }
    }
    return answer_or_wait(exchange);
}

void HttpServer::refuse_unreadable_body(HttpExchange& exchange)
{
    MHD_Connection* connection = exchange.connection_;
    if (const char* coding = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
        coding && ::strcasecmp(coding, "chunked") != 0) {
        // MHD reads any other coding's body until the client closes, so the request would
        // never end while the client waits for its answer (RFC 9112 6.1: 501).
        return exchange.refuse(ServiceError::unsupported_transfer_encoding,
                               fmt::format("Transfer-Encoding '{:.64}' is not supported: send the body with a "
                                           "Content-Length or chunked", coding));
    }
    const char* length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!length || exchange.body_streams_)
        return;
    errno = 0;
    char* end = nullptr;
    const unsigned long long bytes = std::strtoull(length, &end, 10);
    if (errno == 0 && end != length && *end == '\0' && bytes > exchange.max_body_)
        exchange.refuse(ServiceError::body_too_large,
                        fmt::format("the request body is {} bytes; at most {} are taken here", bytes,
                                    exchange.max_body_));
}

void HttpServer::dispatch(const std::shared_ptr<HttpExchange>& exchange)
{
    exchange->dispatched_ = true;
    guard_request(*exchange, [&] { exchange->handler_(exchange); });
}

bool HttpServer::answer_or_wait(HttpExchange& exchange)
{
    if (exchange.answer_ && !exchange.queued_)
        return queue(exchange);
    // The handler answers later: wait without a thread until respond() wakes us.
    if (!exchange.queued_)
        exchange.park();
    return true;
}

bool HttpServer::take_streamed_body(HttpExchange& exchange, const char* data, size_t* size)
{
    if (exchange.answer_ && !exchange.queued_) {
        // Answered before the body ended (an error, or the sandbox ended): the rest is not
        // wanted. MHD takes an answer only once the body is whole, so up to max_body_dropped
        // of it is read and dropped first; past that the connection is closed unanswered.
        if (*size > 0) {
            exchange.body_dropped_ += *size;
            *size = 0;
            return exchange.body_dropped_ <= max_body_dropped;
        }
        return queue(exchange);
    }
    if (*size > 0) {
        if (exchange.body_paused_) {
            // Left unconsumed: MHD hands it over again once resume_body() wakes the connection.
            exchange.park();
            return true;
        }
        const std::string_view piece(data, *size);
        *size = 0;
        if (exchange.on_body_piece_)
            guard_request(exchange, [&] { exchange.on_body_piece_(piece); });
        if (exchange.body_paused_ && !exchange.answer_)
            exchange.park();
        return true;  // answered meanwhile: queued once the body is whole (above)
    }
    if (!exchange.body_ended_) {
        exchange.body_ended_ = true;
        if (exchange.on_body_end_)
            guard_request(exchange, exchange.on_body_end_);
    }
    return answer_or_wait(exchange);
}

bool HttpServer::queue(HttpExchange& exchange)
{
    auto& answer = *exchange.answer_;
    MHD_Response* response = nullptr;
    if (answer.upgrade) {
        response = MHD_create_response_for_upgrade(&HttpCallbacks::upgraded, &exchange);
        if (!response)
            return false;
        for (const auto& [name, value] : exchange.extra_headers_)
            MHD_add_response_header(response, name.c_str(), value.c_str());
        const MHD_Result queued = MHD_queue_response(exchange.connection_, MHD_HTTP_SWITCHING_PROTOCOLS, response);
        MHD_destroy_response(response);
        exchange.queued_ = queued == MHD_YES;
        return exchange.queued_;
    }
    if (answer.streamed) {
        response = MHD_create_response_from_callback(answer.size.value_or(MHD_SIZE_UNKNOWN), 64 * 1024,
                                                     &HttpCallbacks::read_stream, &exchange, nullptr);
    } else {
        response = MHD_create_response_from_buffer(answer.body.size(), answer.body.data(), MHD_RESPMEM_MUST_COPY);
        answer.body.clear();
    }
    if (!response)
        return false;
    if (!answer.content_type.empty())
        MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, answer.content_type.c_str());
    if (answer.retry_after_s)
        MHD_add_response_header(response, MHD_HTTP_HEADER_RETRY_AFTER, std::to_string(*answer.retry_after_s).c_str());
    for (const auto& [name, value] : exchange.extra_headers_)
        MHD_add_response_header(response, name.c_str(), value.c_str());
    const MHD_Result queued = MHD_queue_response(exchange.connection_, static_cast<unsigned>(answer.status), response);
    MHD_destroy_response(response);
    exchange.queued_ = queued == MHD_YES;
    return exchange.queued_;
}

namespace {

// Removes a socket file left at `path` by an earlier serve; refuses to touch anything else.
void remove_stale_socket(const std::string& path, const std::string& listen_path)
{
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0)
        return;
    if (!S_ISSOCK(st.st_mode))
        throw Error(fmt::format("--listen unix:{}: '{}' exists and is not a socket", listen_path, path));
    ::unlink(path.c_str());
}

} // namespace

Fd listen_unix(const std::string& path)
{
    // Bound and listening under a temporary name, then renamed into place: the path appears
    // only once it accepts, so a client that waits for it never meets ECONNREFUSED.
    constexpr std::string_view bound_suffix = ".new";
    const std::string bound_path = path + std::string(bound_suffix);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (path.empty() || bound_path.size() >= sizeof address.sun_path)
        throw Error(fmt::format("--listen unix:{}: the path must be 1 to {} bytes", path,
                                sizeof address.sun_path - 1 - bound_suffix.size()));
    std::memcpy(address.sun_path, bound_path.data(), bound_path.size());
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd)
        throw_errno("creating a Unix socket");
    remove_stale_socket(path, path);
    remove_stale_socket(bound_path, path);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0)
        throw_errno(fmt::format("--listen unix:{}: bind", path));
    // The mode is set before the socket can be reached by its real name.
    if (::chmod(bound_path.c_str(), 0600) != 0 || ::listen(fd.get(), 1024) != 0 ||
        ::rename(bound_path.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(bound_path.c_str());
        throw_errno(fmt::format("--listen unix:{}", path), err);
    }
    return fd;
}

Fd listen_tcp(const std::string& host, uint16_t port)
{
    const std::string numeric = host == "localhost" ? "127.0.0.1" : host;
    sockaddr_storage storage{};
    socklen_t length = 0;
    int family = AF_INET;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
    if (::inet_pton(AF_INET, numeric.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        length = sizeof *v4;
    } else if (::inet_pton(AF_INET6, numeric.c_str(), &v6->sin6_addr) == 1) {
        family = AF_INET6;
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        length = sizeof *v6;
    } else {
        throw Error(fmt::format("--listen tcp:{}:{}: the host must be a numeric IPv4 or IPv6 address or localhost",
                                host, port));
    }
    Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd)
        throw_errno("creating a TCP socket");
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&storage), length) != 0)
        throw_errno(fmt::format("--listen tcp:{}:{}: bind", host, port));
    if (::listen(fd.get(), 1024) != 0)
        throw_errno(fmt::format("--listen tcp:{}:{}: listen", host, port));
    return fd;
}

} // namespace agentvm
