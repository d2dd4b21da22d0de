#include "service/sandbox_snapshots.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

Refusal no_store()
{
    return Refusal{ServiceError::unavailable, "this serve keeps no snapshots (it was started without --state-dir)",
                   std::nullopt};
}

} // namespace

SandboxSnapshots::SandboxSnapshots(const std::string& state_dir, std::chrono::seconds paused_retention,
                                   Registry& registry, Pools& pools, Admission& admission)
    : paused_retention_(paused_retention), registry_(registry), pools_(pools), admission_(admission)
{
    if (!state_dir.empty())
        store_.emplace(state_dir);
}

std::string SandboxSnapshots::new_outbox()
{
    return store_ ? store_->new_outbox() : std::string();
}

void SandboxSnapshots::remove_outbox(const std::string& outbox)
{
    if (store_ && !outbox.empty())
        store_->remove_outbox(outbox);
}

std::optional<Refusal> SandboxSnapshots::admit_restores(unsigned count) const
{
    if (!store_)
        return no_store();
    return admission_.admit_restores(count);
}

void SandboxSnapshots::take_snapshot(Sandbox& sandbox, const std::string& kind, SnapshotTaken done)
{
    std::string name;
    try {
        name = store_->new_name(kind, sandbox.id());
    } catch (const Error& e) {
        return done(SnapshotHold(), e.what());
    }
    const std::string outbox = registry_.outbox_of(sandbox);
    const Json request{{"op", "snapshot"}, {"name", name}};
    sandbox.call(request, request,
                 CallHandlers{[](Json&&) {}, [this, name, outbox, done = std::move(done)](Json&& answer) {
                                  if (!answer.contains("snapshot") || !answer["snapshot"].is_object()) {
                                      const Json& error = answer.contains("error") ? answer["error"] : answer;
                                      return done(SnapshotHold(), error.is_object()
                                                                      ? error.value("message", error.dump())
                                                                      : error.dump());
                                  }
                                  const Json& said = answer["snapshot"]["path"];
                                  SnapshotHold taken;
                                  try {
                                      // Only the directory it was asked to write is taken,
                                      // whatever the answer names.
                                      taken = store_->take_from_outbox(outbox, name,
                                                                       said.is_string() ? said.get<std::string>() : "");
                                  } catch (const Error& e) {
                                      return done(SnapshotHold(), e.what());
                                  }
                                  done(std::move(taken), "");
                              }});
}

void SandboxSnapshots::fork(Sandbox& parent, unsigned count, ForkDone done)
{
    if (auto refusal = admit_restores(count))
        return done({}, &*refusal);
    Sandbox::Settings base = parent.settings();
    base.id.clear();
    const std::string pool_name = parent.pool();
    take_snapshot(parent, "fork", [this, count, base, pool_name, done = std::move(done)](SnapshotHold snapshot,
                                                                                       const std::string& error) {
        if (!snapshot) {
            const Refusal refusal{ServiceError::snapshot_failed, "the parent's live snapshot failed: " + error,
                                  std::nullopt};
            return done({}, &refusal);
        }
        if (auto refusal = admit_restores(count))
            return done({}, &*refusal);
        struct Batch {
            unsigned waiting;
            std::vector<std::weak_ptr<Sandbox>> children;
            std::optional<Refusal> refusal;
            ForkDone done;
        };
        auto batch = std::make_shared<Batch>(Batch{count, {}, std::nullopt, done});
        Pool& pool = pools_.restore_pool(snapshot.path(), pool_name);
        const auto requested = Sandbox::Clock::now();
        // `snapshot` is held until every child has started, so that a child failing before
        // the others have does not take the snapshot with it.
        for (unsigned i = 0; i < count; ++i) {
            try {
                registry_.start_for(
                    pool, base, requested, snapshot.another(), [this, batch](Sandbox* sandbox, const Refusal* refusal) {
                        if (sandbox)
                            batch->children.push_back(registry_.find(sandbox->id()));
                        else if (!batch->refusal)
                            batch->refusal = *refusal;
                        if (--batch->waiting > 0)
                            return;
                        std::vector<Sandbox*> ready;
                        for (const auto& weak : batch->children)
                            if (auto child = weak.lock(); child && !child->stopping())
                                ready.push_back(child.get());
                        if (batch->refusal) {
                            for (Sandbox* child : ready)
                                registry_.remove(*child, "a sibling of its fork failed to start");
                            return batch->done({}, &*batch->refusal);
                        }
                        spdlog::info("forked {} sandboxes", ready.size());
                        batch->done(ready, nullptr);
                    });
            } catch (const Error& e) {
                batch->refusal = Refusal{ServiceError::start_failed, e.what(), std::nullopt};
                batch->waiting -= count - i;
                break;
            }
        }
        pools_.forget_if_unused(pool);
        if (batch->waiting == 0) {
            std::vector<Sandbox*> none;
            batch->done(none, &*batch->refusal);
        }
    });
}

void SandboxSnapshots::pause(Sandbox& sandbox, PauseDone done, bool end_calls)
{
    if (!store_) {
        const Refusal refusal = no_store();
        return done(nullptr, &refusal);
    }
    if (sandbox.running_calls() > 0 && !end_calls) {
        const Refusal refusal{ServiceError::busy,
                              fmt::format("{} call(s) are running: a paused sandbox would lose their answers; pause "
                                          "between calls",
                                          sandbox.running_calls()),
                              std::nullopt};
        return done(nullptr, &refusal);
    }
    std::weak_ptr<Sandbox> weak = registry_.find(sandbox.id());
    // A refused pause drops `snapshot`, and with its one hold the snapshot goes.
    take_snapshot(sandbox, "pause", [this, weak, done = std::move(done)](SnapshotHold snapshot,
                                                                          const std::string& error) {
        auto s = weak.lock();
        const auto refuse = [&](ServiceError code, const std::string& message) {
            const Refusal refusal{code, message, std::nullopt};
            done(nullptr, &refusal);
        };
        if (!snapshot)
            return refuse(ServiceError::snapshot_failed, "the sandbox's live snapshot failed: " + error);
        if (!s || s->stopping() || !registry_.find(s->id()))
            return refuse(ServiceError::ended, "the sandbox ended while it was being paused");
        const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        PausedSandbox record;
        record.settings = s->settings();
        record.pool = s->pool();
        record.paused_at = now;
        record.retain_until = now + paused_retention_.count();
        record.disk_bytes = SnapshotStore::stored_bytes(snapshot.path());
        const std::string id = record.settings.id;
        const uint64_t disk_bytes = record.disk_bytes;
        try {
            store_->add_paused(std::move(record), std::move(snapshot));
        } catch (const Error& e) {
            return refuse(ServiceError::snapshot_failed, e.what());
        }
        registry_.remove(*s, "paused");
        spdlog::info("sandbox {} paused: {} bytes on disk", id, disk_bytes);
        done(&store_->paused().at(id), nullptr);
    });
}

void SandboxSnapshots::resume(const std::string& id, CreateDone done)
{
    const PausedSandbox* record = find_paused(id);
    if (!record) {
        const Refusal refusal{ServiceError::not_found, fmt::format("no paused sandbox {}", id), std::nullopt};
        return done(nullptr, &refusal);
    }
    if (resuming_.contains(id)) {
        const Refusal refusal{ServiceError::resuming, fmt::format("sandbox {} is being resumed already", id),
                              std::nullopt};
        return done(nullptr, &refusal);
    }
    if (auto refusal = admit_restores(1))
        return done(nullptr, &*refusal);
    Pool& pool = pools_.restore_pool(record->snapshot, record->pool);
    auto resumed = [this, id, done](Sandbox* sandbox, const Refusal* refusal) {
        resuming_.erase(id);
        if (sandbox && deleted_while_resuming_.erase(id) > 0) {
            // Its DELETE was answered "deleted" (remove_paused): it must not run on.
            registry_.unlist(id);
            sandbox->stop("deleted");
            const Refusal deleted{ServiceError::ended,
                                  fmt::format("sandbox {} was deleted while it was being resumed", id), std::nullopt};
            return done(nullptr, &deleted);
        }
        deleted_while_resuming_.erase(id);
        if (sandbox) {
            store_->remove_paused(id);
            registry_.forget_end(id);
            spdlog::info("sandbox {} resumed", id);
        }
        done(sandbox, refusal);
    };
    resuming_.insert(id);
    try {
        registry_.start_for(pool, record->settings, Sandbox::Clock::now(), store_->hold(record->snapshot),
                            std::move(resumed));
    } catch (const Error& e) {
        resuming_.erase(id);
        pools_.forget_if_unused(pool);
        const Refusal refusal{ServiceError::start_failed, e.what(), std::nullopt};
        return done(nullptr, &refusal);
    }
}

void SandboxSnapshots::keep(Sandbox& sandbox, std::vector<std::string> names, KeepDone done)
{
    if (!store_) {
        const Refusal refusal = no_store();
        return done(nullptr, &refusal);
    }
    KeptSnapshot record;
    record.sandbox_id = sandbox.id();
    record.pool = sandbox.pool();
    record.names = std::move(names);
    record.settings = sandbox.settings();
    record.settings.id.clear();
    take_snapshot(sandbox, "keep", [this, record = std::move(record), done = std::move(done)](
                                       SnapshotHold snapshot, const std::string& error) mutable {
        if (!snapshot) {
            const Refusal refusal{ServiceError::snapshot_failed, "the sandbox's live snapshot failed: " + error,
                                  std::nullopt};
            return done(nullptr, &refusal);
        }
        try {
            record.id = store_->new_kept_id();
            record.created_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count();
            const std::string id = record.id;
            store_->add_kept(std::move(record), std::move(snapshot));
            spdlog::info("snapshot {} kept", id);
            done(&store_->kept().at(id), nullptr);
        } catch (const Error& e) {
            const Refusal refusal{ServiceError::snapshot_failed, e.what(), std::nullopt};
            done(nullptr, &refusal);
        }
    });
}

void SandboxSnapshots::create_from_kept(const std::string& id, Sandbox::Settings settings, CreateDone done)
{
    const KeptSnapshot* record = find_kept(id);
    if (!record) {
        const Refusal refusal{ServiceError::not_found, fmt::format("no snapshot {}", id), std::nullopt};
        return done(nullptr, &refusal);
    }
    if (auto refusal = admit_restores(1))
        return done(nullptr, &*refusal);
    Pool& pool = pools_.restore_pool(record->snapshot, record->pool);
    settings.id.clear();
    try {
        // A copy of `done`: a start that throws has not called it, and it is called here.
        registry_.start_for(pool, std::move(settings), Sandbox::Clock::now(), store_->hold(record->snapshot), done);
    } catch (const Error& e) {
        pools_.forget_if_unused(pool);
        const Refusal refusal{ServiceError::start_failed, e.what(), std::nullopt};
        return done(nullptr, &refusal);
    }
}

const KeptSnapshot* SandboxSnapshots::find_kept(const std::string& id) const
{
    if (!store_)
        return nullptr;
    auto it = store_->kept().find(id);
    return it == store_->kept().end() ? nullptr : &it->second;
}

std::vector<const KeptSnapshot*> SandboxSnapshots::kept() const
{
    std::vector<const KeptSnapshot*> list;
    if (store_)
        for (const auto& [id, record] : store_->kept())
            list.push_back(&record);
    return list;
}

bool SandboxSnapshots::remove_kept(const std::string& id)
{
    if (!find_kept(id))
        return false;
    store_->remove_kept(id);
    return true;
}

const PausedSandbox* SandboxSnapshots::find_paused(const std::string& id) const
{
    if (!store_)
        return nullptr;
    auto it = store_->paused().find(id);
    return it == store_->paused().end() ? nullptr : &it->second;
}

std::vector<const PausedSandbox*> SandboxSnapshots::paused() const
{
    std::vector<const PausedSandbox*> list;
    if (store_)
        for (const auto& [id, record] : store_->paused())
            list.push_back(&record);
    return list;
}

void SandboxSnapshots::remove_paused(std::string id, const std::string& reason)
{
    if (!store_ || !store_->paused().contains(id))
        return;
    // A resume under way ends its VM when it is ready (resume's `resumed`).
    if (resuming_.contains(id))
        deleted_while_resuming_.insert(id);
    store_->remove_paused(id);
    registry_.remember_end(id, reason);
}

void SandboxSnapshots::expire_paused(std::chrono::system_clock::time_point now)
{
    if (!store_)
        return;
    const int64_t wall = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    std::vector<std::string> past;
    for (const auto& [id, record] : store_->paused())
        if (record.retain_until <= wall && !resuming_.contains(id))
            past.push_back(id);
    for (const std::string& id : past)
        remove_paused(id, "paused past its retention (--paused-retention)");
}

} // namespace agentvm
