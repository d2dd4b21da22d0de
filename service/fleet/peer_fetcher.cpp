#include "service/fleet/peer_fetcher.hpp"

#include <curl/curl.h>
#include <sys/epoll.h>

#include <cctype>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>
#include <type_traits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

// The header keeps curl's types out: CURL and CURLM are void there, sockets ints.
static_assert(std::is_same_v<CURL, void> && std::is_same_v<CURLM, void> && std::is_same_v<curl_socket_t, int>);

struct PeerFetcher::FanOut {
    std::vector<PeerAnswer> answers;
    size_t pending = 0;
    Done done;
};

struct PeerFetcher::Transfer {
    std::shared_ptr<FanOut> fan_out;
    size_t index = 0;
    size_t max_body = 0;
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    std::string body;
    bool too_large = false;
    std::optional<std::string> next_token;
    char error[CURL_ERROR_SIZE] = {};

    Transfer() = default;
    Transfer(const Transfer&) = delete;
    Transfer& operator=(const Transfer&) = delete;
    ~Transfer()
    {
        if (easy)
            curl_easy_cleanup(easy);
        curl_slist_free_all(headers);
    }
};

namespace {

constexpr std::string_view next_token_header = "x-next-token:";
constexpr size_t max_next_token = 1024;

void global_init()
{
    static std::once_flag once;
    std::call_once(once, [] {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            throw Error("curl_global_init failed");
    });
}

template <typename Value>
void set(CURL* easy, CURLoption option, Value value)
{
    if (const CURLcode code = curl_easy_setopt(easy, option, value); code != CURLE_OK)
        throw Error(fmt::format("curl_easy_setopt({}): {}", static_cast<int>(option), curl_easy_strerror(code)));
}

std::string seconds(std::chrono::milliseconds ms)
{
    return ms.count() % 1000 == 0 ? fmt::format("{} s", ms.count() / 1000) : fmt::format("{} ms", ms.count());
}

} // namespace

PeerFetcher::PeerFetcher(EventLoop& loop, std::vector<Peer> peers, PeerLimits limits)
    : loop_(loop), peers_(std::move(peers)), limits_(limits), epoll_(::epoll_create1(EPOLL_CLOEXEC))
{
    if (!epoll_)
        throw_errno("epoll_create1 for the peers' connections");
    global_init();
    multi_ = curl_multi_init();
    if (!multi_)
        throw Error("curl_multi_init failed");
    curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &PeerFetcher::on_socket);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &PeerFetcher::on_timer);
    curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
    timer_.emplace(loop_, [this] { on_timeout(); });
    soon_.emplace(loop_, [this] { finish(std::exchange(complete_, {})); });
    loop_.watch_readable(epoll_.get(), [this] { on_ready(); });
}

PeerFetcher::~PeerFetcher()
{
    loop_.unwatch(epoll_.get());
    for (auto& [easy, transfer] : transfers_)
        curl_multi_remove_handle(multi_, easy);
    transfers_.clear();
    curl_multi_cleanup(multi_);
}

void PeerFetcher::get_all(const std::string& target, const std::vector<std::string>& headers, Done done)
{
    auto fan_out = std::make_shared<FanOut>();
    fan_out->done = std::move(done);
    for (const Peer& peer : peers_)
        fan_out->answers.push_back(PeerAnswer{peer.node, "", 0, "", std::nullopt});
    if (fan_outs_ >= limits_.max_fan_outs) {
        for (PeerAnswer& answer : fan_out->answers)
            answer.problem = fmt::format("not asked: {} fleet listings were running already", fan_outs_);
    } else {
        ++fan_outs_;
        for (size_t i = 0; i < peers_.size(); ++i) {
            auto transfer = std::make_unique<Transfer>();
            transfer->fan_out = fan_out;
            transfer->index = i;
            transfer->max_body = limits_.max_body;
            transfer->easy = curl_easy_init();
            try {
                if (!transfer->easy)
                    throw Error("curl_easy_init failed");
                CURL* easy = transfer->easy;
                set(easy, CURLOPT_URL, (peers_[i].url + target).c_str());
                set(easy, CURLOPT_PROTOCOLS_STR, "http");
                set(easy, CURLOPT_PROXY, "");
                set(easy, CURLOPT_FOLLOWLOCATION, 0L);
                set(easy, CURLOPT_NOSIGNAL, 1L);
                set(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(limits_.connect_timeout.count()));
                set(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(limits_.total_timeout.count()));
                set(easy, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(limits_.max_body));
                set(easy, CURLOPT_WRITEFUNCTION, &PeerFetcher::on_body);
                set(easy, CURLOPT_WRITEDATA, transfer.get());
                set(easy, CURLOPT_HEADERFUNCTION, &PeerFetcher::on_header);
                set(easy, CURLOPT_HEADERDATA, transfer.get());
                set(easy, CURLOPT_ERRORBUFFER, transfer->error);
                set(easy, CURLOPT_PRIVATE, transfer.get());
                std::vector<std::string> lines = headers;
                lines.push_back(fmt::format("{}: {}", list_scope_header, list_scope_node));
                lines.push_back("Accept: application/json");
                for (const std::string& line : lines) {
                    curl_slist* appended = curl_slist_append(transfer->headers, line.c_str());
                    if (!appended)
                        throw Error("curl_slist_append failed");
                    transfer->headers = appended;
                }
                set(easy, CURLOPT_HTTPHEADER, transfer->headers);
                if (const CURLMcode code = curl_multi_add_handle(multi_, easy); code != CURLM_OK)
                    throw Error(fmt::format("curl_multi_add_handle: {}", curl_multi_strerror(code)));
            } catch (const Error& e) {
                spdlog::error("asking peer {} for its list: {}", peers_[i].node, e.what());
                fan_out->answers[i].problem = "not asked: serve could not start the request (logged)";
                continue;
            }
            ++fan_out->pending;
            void* key = transfer->easy;
            transfers_.emplace(key, std::move(transfer));
        }
        if (fan_out->pending == 0)
            --fan_outs_;
    }
    if (fan_out->pending == 0) {
        complete_.push_back(std::move(fan_out));
        soon_->arm(std::chrono::nanoseconds(1));
    }
}

int PeerFetcher::on_socket(void* /*easy*/, int socket, int what, void* self_ptr, void* /*socket_data*/)
{
    auto* self = static_cast<PeerFetcher*>(self_ptr);
    if (what == CURL_POLL_REMOVE) {
        // curl removes a socket before it closes it: it is still open here.
        ::epoll_ctl(self->epoll_.get(), EPOLL_CTL_DEL, socket, nullptr);
        self->watched_.erase(socket);
        return 0;
    }
    epoll_event event{};
    event.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
    event.data.fd = socket;
    const bool known = self->watched_.contains(socket);
    if (::epoll_ctl(self->epoll_.get(), known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, socket, &event) != 0) {
        spdlog::error("epoll_ctl on a peer's connection: {}", std::strerror(errno));
        return -1;  // curl fails that transfer
    }
    self->watched_.insert(socket);
    return 0;
}

int PeerFetcher::on_timer(void* /*multi*/, long timeout_ms, void* self_ptr)
{
    auto* self = static_cast<PeerFetcher*>(self_ptr);
    // Called inside curl: nothing may be thrown through it.
    try {
        if (timeout_ms < 0)
            self->timer_->cancel();
        else
            self->timer_->arm(std::chrono::milliseconds(timeout_ms));
        return 0;
    } catch (const std::exception& e) {
        spdlog::error("the peers' timer: {}", e.what());
        return -1;
    }
}

size_t PeerFetcher::on_body(char* data, size_t size, size_t count, void* transfer_ptr)
{
    auto* transfer = static_cast<Transfer*>(transfer_ptr);
    const size_t bytes = size * count;
    if (transfer->body.size() + bytes > transfer->max_body) {
        transfer->too_large = true;
        return 0;  // curl ends the transfer (CURLE_WRITE_ERROR)
    }
    transfer->body.append(data, bytes);
    return bytes;
}

size_t PeerFetcher::on_header(char* data, size_t size, size_t count, void* transfer_ptr)
{
    auto* transfer = static_cast<Transfer*>(transfer_ptr);
    const size_t bytes = size * count;
    std::string_view line(data, bytes);
    if (line.starts_with("HTTP/"))  // a new answer (after a 100 Continue): its own headers
        transfer->next_token.reset();
    if (line.size() > next_token_header.size() && line.size() < next_token_header.size() + max_next_token) {
        std::string name(line.substr(0, next_token_header.size()));
        for (char& c : name)
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (name == next_token_header) {
            line.remove_prefix(next_token_header.size());
            const size_t start = line.find_first_not_of(" \t");
            const size_t end = line.find_last_not_of(" \t\r\n");
            if (start != std::string_view::npos && end != std::string_view::npos && end >= start)
                transfer->next_token = std::string(line.substr(start, end - start + 1));
        }
    }
    return bytes;
}

void PeerFetcher::on_ready()
{
    epoll_event events[32];
    const int count = ::epoll_wait(epoll_.get(), events, 32, 0);
    for (int i = 0; i < count; ++i) {
        int flags = 0;
        if (events[i].events & EPOLLIN)
            flags |= CURL_CSELECT_IN;
        if (events[i].events & EPOLLOUT)
            flags |= CURL_CSELECT_OUT;
        if (events[i].events & (EPOLLERR | EPOLLHUP))
            flags |= CURL_CSELECT_ERR;
        int running = 0;
        curl_multi_socket_action(multi_, events[i].data.fd, flags, &running);
    }
    collect();
}

void PeerFetcher::on_timeout()
{
    int running = 0;
    curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &running);
    collect();
}

PeerAnswer PeerFetcher::answer_of(Transfer& transfer, int result, const PeerLimits& limits)
{
    PeerAnswer answer = transfer.fan_out->answers[transfer.index];
    const auto code = static_cast<CURLcode>(result);
    if (code == CURLE_OK) {
        long status = 0;
        curl_easy_getinfo(transfer.easy, CURLINFO_RESPONSE_CODE, &status);
        answer.status = status;
        answer.body = std::move(transfer.body);
        answer.next_token = std::move(transfer.next_token);
        return answer;
    }
    const std::string detail = transfer.error[0] ? transfer.error : curl_easy_strerror(code);
    spdlog::debug("peer {}: {}", answer.node, detail);
    switch (code) {
    case CURLE_WRITE_ERROR:
    case CURLE_FILESIZE_EXCEEDED:
        answer.problem = transfer.too_large || code == CURLE_FILESIZE_EXCEEDED
                             ? fmt::format("its answer is larger than {} MiB", limits.max_body >> 20)
                             : detail;
        break;
    case CURLE_OPERATION_TIMEDOUT: {
        curl_off_t connected_after_us = 0;
        curl_easy_getinfo(transfer.easy, CURLINFO_CONNECT_TIME_T, &connected_after_us);
        answer.problem = connected_after_us == 0 ? fmt::format("no connection within {}", seconds(limits.connect_timeout))
                                         : fmt::format("no whole answer within {}", seconds(limits.total_timeout));
        break;
    }
    case CURLE_COULDNT_CONNECT:
        answer.problem = "could not connect";
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
        answer.problem = "its host name does not resolve";
        break;
    case CURLE_GOT_NOTHING:
        answer.problem = "it closed the connection without an answer";
        break;
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
        answer.problem = "the connection failed midway";
        break;
    default:
        answer.problem = detail;
    }
    return answer;
}

void PeerFetcher::collect()
{
    std::vector<std::shared_ptr<FanOut>> complete;
    int left = 0;
    while (CURLMsg* message = curl_multi_info_read(multi_, &left)) {
        if (message->msg != CURLMSG_DONE)
            continue;
        const auto it = transfers_.find(message->easy_handle);
        if (it == transfers_.end())
            continue;
        Transfer& transfer = *it->second;
        const int result = message->data.result;  // `message` is gone once its handle is removed
        std::shared_ptr<FanOut> fan_out = transfer.fan_out;
        fan_out->answers[transfer.index] = answer_of(transfer, result, limits_);
        curl_multi_remove_handle(multi_, transfer.easy);
        transfers_.erase(it);
        if (--fan_out->pending == 0) {
            --fan_outs_;
            complete.push_back(std::move(fan_out));
        }
    }
    finish(std::move(complete));
}

void PeerFetcher::finish(std::vector<std::shared_ptr<FanOut>> complete)
{
    // One failing `done` leaves the others theirs (each facade guards its own request too).
    for (const std::shared_ptr<FanOut>& fan_out : complete) {
        try {
            fan_out->done(std::move(fan_out->answers));
        } catch (const std::exception& e) {
            spdlog::error("answering a fleet list: {}", e.what());
        }
    }
}

void PeerFetcher::log_unreached(const std::vector<Unreached>& unreached)
{
    const auto now = std::chrono::steady_clock::now();
    for (const Unreached& entry : unreached) {
        auto [it, first] = warned_.try_emplace(entry.node, now);
        if (first || now - it->second >= std::chrono::minutes(1)) {
            it->second = now;
            spdlog::warn("fleet list: node {} is missing from the answer: {} (said at most once a minute)", entry.node,
                         entry.problem);
        } else {
            spdlog::debug("fleet list: node {} is missing from the answer: {}", entry.node, entry.problem);
        }
    }
}

} // namespace agentvm
