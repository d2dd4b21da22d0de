#include "service/call_history.hpp"

#include <algorithm>

#include "service/wall_clock.hpp"

namespace agentvm {
namespace {

// Keeps what fits of `bytes` in `kept`; says whether anything was left out.
void keep(std::string& kept, bool& clipped, std::string_view bytes)
{
    const size_t room = CallHistory::output_kept - kept.size();
    kept.append(bytes.substr(0, room));
    clipped = clipped || bytes.size() > room;
}

// A string's first `room` bytes at most, cut where a UTF-8 character starts (a JSON string
// holds whole characters, and a cut one would not dump).
std::string utf8_prefix(const std::string& text, size_t room)
{
    if (text.size() <= room)
        return text;
    size_t end = room;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
        --end;
    return text.substr(0, end);
}

// A copy of `value` that costs at most `budget` bytes (roughly its JSON text), which is
// charged for what is kept; `clipped` is set when anything was left out.
Json clipped_copy(const Json& value, size_t& budget, bool& clipped, int depth)
{
    const auto charge = [&](size_t bytes) {
        budget -= std::min(budget, bytes);
    };
    if (depth > CallHistory::depth_kept) {
        clipped = true;
        return nullptr;
    }
    if (value.is_string()) {
        const std::string& text = value.get_ref<const std::string&>();
        std::string kept = utf8_prefix(text, budget);
        clipped = clipped || kept.size() < text.size();
        charge(kept.size() + 2);
        return kept;
    }
    if (value.is_object()) {
        Json copy = Json::object();
        for (const auto& [key, member] : value.items()) {
            if (budget <= key.size() + 3) {
                clipped = true;
                break;
            }
            charge(key.size() + 3);
            copy[key] = clipped_copy(member, budget, clipped, depth + 1);
        }
        return copy;
    }
    if (value.is_array()) {
        Json copy = Json::array();
        for (const Json& element : value) {
            if (budget <= 1) {
                clipped = true;
                break;
            }
            charge(1);
            copy.push_back(clipped_copy(element, budget, clipped, depth + 1));
        }
        return copy;
    }
    charge(8);  // a number, a boolean or null
    return value;
}

} // namespace

uint64_t CallHistory::begin(Json request_summary)
{
    const uint64_t seq = next_seq_++;
    Entry entry{};
    entry.seq = seq;
    entry.request = std::move(request_summary);
    entry.started_wall = std::chrono::system_clock::now();
    entries_.push_back(std::move(entry));
    while (entries_.size() > limit_) {
        entries_.pop_front();
        ++dropped_;
    }
    return seq;
}

CallHistory::Entry* CallHistory::find(uint64_t seq)
{
    if (entries_.empty() || seq < entries_.front().seq)
        return nullptr;
    const size_t index = seq - entries_.front().seq;
    return index < entries_.size() ? &entries_[index] : nullptr;
}

void CallHistory::add_output(uint64_t seq, const std::string& stream, std::string_view bytes)
{
    Entry* entry = find(seq);
    if (!entry)
        return;
    entry->streamed = true;
    if (stream == "stdout")
        keep(entry->stdout_kept, entry->stdout_clipped, bytes);
    else if (stream == "stderr")
        keep(entry->stderr_kept, entry->stderr_clipped, bytes);
}

void CallHistory::end(uint64_t seq, const Json& answer)
{
    Entry* entry = find(seq);
    if (!entry)
        return;
    Json result = Json::object();
    size_t budget = fields_kept;
    bool clipped = false;
    for (const auto& [key, value] : answer.items()) {
        const bool output = key == "stdout" || key == "stderr" || key == "stdout_b64" || key == "stderr_b64";
        if (output)
            continue;
        if (budget <= key.size() + 3) {
            clipped = true;
            break;
        }
        budget -= key.size() + 3;
        result[key] = clipped_copy(value, budget, clipped, 1);
    }
    if (clipped)
        result["clipped"] = true;
    // A streamed call's output came as events; otherwise it is in the answer.
    if (!entry->streamed) {
        for (const char* stream : {"stdout", "stderr"}) {
            try {
                if (auto bytes = get_bytes(answer, stream))
                    add_output(seq, stream, *bytes);
            } catch (const CallError&) {
                // Not the agent's spelling: nothing of it is kept.
            }
        }
    }
    entry->answer = std::move(result);
}

Json CallHistory::to_json() const
{
    Json calls = Json::array();
    for (const Entry& entry : entries_) {
        Json item{{"seq", entry.seq}, {"request", entry.request}, {"started_at", unix_seconds(entry.started_wall)}};
        if (!entry.answer) {
            item["running"] = true;
        } else {
            Json result = *entry.answer;
            if (entry.answer->contains("exit_code") || !entry.stdout_kept.empty() || !entry.stderr_kept.empty()) {
                put_bytes(result, "stdout", entry.stdout_kept);
                put_bytes(result, "stderr", entry.stderr_kept);
                result["stdout_clipped"] = entry.stdout_clipped;
                result["stderr_clipped"] = entry.stderr_clipped;
            }
            item[result.contains("error") ? "error" : "result"] =
                result.contains("error") ? result["error"] : result;
        }
        calls.push_back(std::move(item));
    }
    return Json{{"calls", std::move(calls)}, {"dropped", dropped_}};
}

} // namespace agentvm
