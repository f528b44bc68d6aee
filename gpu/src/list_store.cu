// ListStore (list_store.h): the inverted lists' buffers, their appends and
// removals.
#include "list_store.h"

#include <algorithm>
#include <string>

#include "context_impl.h"
#include "engine/error.h"
#include "gpu_ivfpq/gpu_context.h"
#include "ivfpq_kernels.h"
#include "list_layout.cuh"

namespace gpuivfpq::gpu {

void ListStore::init_lists(size_t d_, size_t lists_, size_t m_, bool vt, bool vectors, bool keys, bool interleave)
{
    require(!interleave || m_ % 4 == 0, "interleaved list codes must be whole words");
    interleaved = interleave;
    d = d_;
    lists = lists_;
    m = m_;
    has_vt = vt;
    has_vectors = vectors;
    has_keys = keys;
    lst.resize(lists);
    code_ptrs = DeviceBuffer(ctx, lists * sizeof(void*));
    id_ptrs = DeviceBuffer(ctx, lists * sizeof(void*));
    vt_ptrs = DeviceBuffer(ctx, lists * sizeof(void*));
    if (has_vectors)
        vec_ptrs = DeviceBuffer(ctx, lists * sizeof(void*));
    if (has_keys)
        key_ptrs = DeviceBuffer(ctx, lists * sizeof(void*));
    lens = DeviceBuffer(ctx, lists * sizeof(int32_t));
    upload_meta();
}

void ListStore::grow(size_t l, size_t need)
{
    List& L = lst[l];
    if (need <= L.cap)
        return;
    const cudaStream_t st = ctx.impl().stream;
    size_t cap = std::max(need, L.cap + L.cap / 2);
    if (interleaved)  // whole blocks
        cap = (cap + kInterleaveRows - 1) / kInterleaveRows * kInterleaveRows;
    DeviceBuffer codes(ctx, cap * m), ids(ctx, cap * sizeof(int64_t));
    DeviceBuffer vt = has_vt ? DeviceBuffer(ctx, cap * sizeof(float)) : DeviceBuffer();
    DeviceBuffer vecs = has_vectors ? DeviceBuffer(ctx, cap * d * sizeof(float)) : DeviceBuffer();
    DeviceBuffer keys = has_keys ? DeviceBuffer(ctx, cap * sizeof(int64_t)) : DeviceBuffer();
    if (L.size && has_vt)
        GPU_CUDA_CHECK(cudaMemcpyAsync(vt.data(), L.vt.data(), L.size * sizeof(float), cudaMemcpyDeviceToDevice, st));
    if (L.size && has_vectors)
        GPU_CUDA_CHECK(cudaMemcpyAsync(vecs.data(), L.vecs.data(), L.size * d * sizeof(float),
                                       cudaMemcpyDeviceToDevice, st));
    if (L.size && has_keys)
        GPU_CUDA_CHECK(cudaMemcpyAsync(keys.data(), L.keys.data(), L.size * sizeof(int64_t),
                                       cudaMemcpyDeviceToDevice, st));
    if (L.size) {
        // Interleaved: the blocks the entries occupy (a prefix, whatever
        // the capacity).
        const size_t rows =
            interleaved ? (L.size + kInterleaveRows - 1) / kInterleaveRows * kInterleaveRows : L.size;
        GPU_CUDA_CHECK(cudaMemcpyAsync(codes.data(), L.codes.data(), rows * m, cudaMemcpyDeviceToDevice, st));
        GPU_CUDA_CHECK(cudaMemcpyAsync(ids.data(), L.ids.data(), L.size * sizeof(int64_t), cudaMemcpyDeviceToDevice,
                                       st));
    }
    L.codes = std::move(codes);
    L.ids = std::move(ids);
    L.vt = std::move(vt);
    L.vecs = std::move(vecs);
    L.keys = std::move(keys);
    L.cap = cap;
}

void ListStore::upload_meta(size_t lo, size_t hi)
{
    hi = std::min(hi, lists);
    if (lo == 0 && hi == lists)
        max_len = 0;
    if (lo >= hi)
        return;
    // reserve waits for an earlier call's copies from the pinned host copy.
    char* h = meta_host.reserve(lists * (5 * sizeof(void*) + sizeof(int32_t)));
    const void** cp = reinterpret_cast<const void**>(h);
    const void** ip = cp + lists;
    const void** vp = ip + lists;
    const void** xp = vp + lists;
    const void** kp = xp + lists;
    int32_t* ln = reinterpret_cast<int32_t*>(kp + lists);
    for (size_t l = lo; l < hi; ++l) {
        cp[l] = lst[l].codes.data();
        ip[l] = lst[l].ids.data();
        vp[l] = lst[l].vt.data();
        xp[l] = lst[l].vecs.data();
        kp[l] = lst[l].keys.data();
        ln[l] = static_cast<int32_t>(lst[l].size);
        max_len = std::max(max_len, lst[l].size);
    }
    const size_t n = hi - lo;
    const cudaStream_t st = ctx.impl().stream;
    auto put = [&](const DeviceBuffer& dst, const void* src, size_t elem) {
        GPU_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data()) + lo * elem,
                                       static_cast<const char*>(src) + lo * elem, n * elem, cudaMemcpyHostToDevice,
                                       st));
    };
    put(code_ptrs, cp, sizeof(void*));
    put(id_ptrs, ip, sizeof(void*));
    put(vt_ptrs, vp, sizeof(void*));
    if (has_vectors)
        put(vec_ptrs, xp, sizeof(void*));
    if (has_keys)
        put(key_ptrs, kp, sizeof(void*));
    put(lens, ln, sizeof(int32_t));
    meta_host.after_copy(st);
}

void ListStore::append(const char* who, size_t n, const int32_t* list_ids, const uint8_t* codes,
                       const int64_t* ids, const float* vectors, const int64_t* keys, const TermFn& term)
{
    if (!n)
        return;  // an empty batch may come with any pointers (an empty vector's data())
    const std::string w(who);
    if (has_vectors && !vectors)
        throw Error(ErrorKind::InvalidArgument, w + ": the index stores vectors (store_vectors) but none were given");
    if (!has_vectors && vectors)
        throw Error(ErrorKind::InvalidArgument, w + ": vectors given to an index without store_vectors");
    if (has_keys && !keys)
        throw Error(ErrorKind::InvalidArgument,
                    w + ": the index keeps filter keys (filter_keys) but none were given");
    if (!has_keys && keys)
        throw Error(ErrorKind::InvalidArgument, w + ": filter keys given to an index without filter_keys");
    require(ntotal + n < (size_t(1) << 31), "GPU index: more than 2^31 vectors");
    std::vector<size_t> count(lists + 1, 0);
    for (size_t i = 0; i < n; ++i) {
        if (list_ids[i] < 0 || static_cast<size_t>(list_ids[i]) >= lists)  // no message built per entry
            throw Error(ErrorKind::InvalidArgument, w + ": list id out of range");
        count[list_ids[i] + 1]++;
    }
    for (size_t l = 0; l < lists; ++l)
        count[l + 1] += count[l];  // count[l] = first slot of list l
    std::vector<int32_t> touched;
    for (size_t l = 0; l < lists; ++l)
        if (count[l + 1] > count[l])
            touched.push_back(static_cast<int32_t>(l));
    const size_t nt = touched.size();
    // The batch, sorted by list, staged in pinned memory in one block (codes,
    // ids, list ids, vectors, keys, each entry's position in its list, the
    // touched lists and their new lengths) and copied to the device in one
    // copy; one launch then writes every entry into its list and the lists'
    // lengths (a copy per list and array, and the lists' pointers uploaded
    // again, cost ~130 us for an append of one row). Both allocated before
    // any list changes, so that their failure leaves the index as it was.
    Carver sz;
    sz.take<uint8_t>(n * m);
    sz.take<int64_t>(n);
    sz.take<int32_t>(n);
    sz.take<float>(vectors ? n * d : 0);
    sz.take<int64_t>(keys ? n : 0);
    sz.take<int32_t>(n);   // positions
    sz.take<int32_t>(nt);  // touched lists
    sz.take<int32_t>(nt);  // their new lengths
    sz.take<float>(has_vt ? n : 0);  // the entries' terms, computed on the device
    // reserve waits for an earlier append's copy from the staging.
    char* host = add_host.reserve(sz.size());
    // From the context's scratch arena: a cudaMalloc/cudaFree pair per
    // append (a change-log run of a few rows) cost more than the copies.
    Scratch dbatch(ctx, sz.size());
    // Grow the touched lists that lack room: an out-of-memory error leaves
    // the contents and sizes as they were, and the kernels' pointer arrays
    // name the lists that did grow (their old buffers are gone).
    std::vector<size_t> grown;
    try {
        for (int32_t l : touched) {
            const size_t need = lst[l].size + (count[l + 1] - count[l]);
            if (need > lst[l].cap) {
                grow(l, need);
                grown.push_back(size_t(l));
            }
        }
    } catch (...) {
        // grown is in list order: one upload covers them (a reserve per
        // list would wait for the previous one's copy, queued behind the
        // grown lists' copies).
        if (!grown.empty())
            upload_meta(grown.front(), grown.back() + 1);
        ctx.synchronize();
        throw;
    }
    // The grown lists' new buffers (and their sizes, still the old ones)
    // before the launch that writes there, in one upload (as above).
    if (!grown.empty())
        upload_meta(grown.front(), grown.back() + 1);
    Carver hc(host), dc(dbatch.data());
    uint8_t* scodes = hc.take<uint8_t>(n * m);
    int64_t* sids = hc.take<int64_t>(n);
    int32_t* slists = hc.take<int32_t>(n);
    float* svecs = hc.take<float>(vectors ? n * d : 0);
    int64_t* skeys = hc.take<int64_t>(keys ? n : 0);
    int32_t* spos = hc.take<int32_t>(n);
    int32_t* stouched = hc.take<int32_t>(nt);
    int32_t* slen = hc.take<int32_t>(nt);
    const uint8_t* dcodes = dc.take<uint8_t>(n * m);
    const int64_t* dids = dc.take<int64_t>(n);
    const int32_t* dl = dc.take<int32_t>(n);
    const float* dvecs = dc.take<float>(vectors ? n * d : 0);
    const int64_t* dkeys = dc.take<int64_t>(keys ? n : 0);
    const int32_t* dpos = dc.take<int32_t>(n);
    const int32_t* dtouched = dc.take<int32_t>(nt);
    const int32_t* dlen = dc.take<int32_t>(nt);
    float* dvt = dc.take<float>(has_vt ? n : 0);
    {
        std::vector<size_t> fill(count.begin(), count.end() - 1);
        for (size_t i = 0; i < n; ++i) {
            const int32_t l = list_ids[i];
            const size_t s = fill[l]++;
            std::copy(codes + i * m, codes + (i + 1) * m, scodes + s * m);
            sids[s] = ids[i];
            slists[s] = l;
            spos[s] = static_cast<int32_t>(lst[l].size + (s - count[l]));
            if (vectors)
                std::copy(vectors + i * d, vectors + (i + 1) * d, svecs + s * d);
            if (keys)
                skeys[s] = keys[i];
        }
        for (size_t t = 0; t < nt; ++t) {
            const int32_t l = touched[t];
            stouched[t] = l;
            slen[t] = static_cast<int32_t>(lst[l].size + (count[l + 1] - count[l]));
        }
    }
    const cudaStream_t st = ctx.impl().stream;
    GPU_CUDA_CHECK(cudaMemcpyAsync(dbatch.data(), host, sz.size(), cudaMemcpyHostToDevice, st));
    add_host.after_copy(st);
    if (has_vt)
        term(dcodes, dl, n, dvt);
    launch_append_entries(code_ptrs.as<uint8_t* const>(), id_ptrs.as<int64_t* const>(), vt_ptrs.as<float* const>(),
                          vec_ptrs.as<float* const>(), key_ptrs.as<int64_t* const>(), lens.as<int32_t>(), dl, dpos,
                          static_cast<int64_t>(n), static_cast<int>(m), static_cast<int>(d), dcodes, dids,
                          has_vt ? dvt : nullptr, vectors ? dvecs : nullptr, keys ? dkeys : nullptr, dtouched,
                          dlen, static_cast<int64_t>(nt), interleaved, st);
    for (int32_t l : touched) {
        const double was = double(lst[l].size);
        lst[l].size += count[l + 1] - count[l];
        ntotal_sq += double(lst[l].size) * double(lst[l].size) - was * was;
        max_len = std::max(max_len, lst[l].size);
    }
    ntotal += n;
    // No wait for the device: whatever runs next on the context's stream
    // (a search, another change) runs after these writes, the scratch
    // batch is stream-ordered like all scratch, and the staging waits in
    // reserve. A fault of these kernels surfaces at the next wait (the
    // next search, change or reserve on this context), reported there as a
    // device error; such faults are sticky, so the device is then taken
    // out of service rather than serving the unwritten entries. (Two waits
    // here made a one-row append hold the GPU process's exclusive lock
    // ~100 us; a search waits for the append's few microseconds of device
    // work instead.)
}

size_t ListStore::remove(const int64_t* ids, size_t n)
{
    if (!n || !ntotal)
        return 0;
    // The ids are found on the device: each list's block binary-searches the
    // sorted removal set for every stored id and compacts the list in place.
    std::vector<int64_t> gone(ids, ids + n);
    std::sort(gone.begin(), gone.end());
    gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
    Carver sz;
    sz.take<int64_t>(gone.size());
    sz.take<int32_t>(lists);
    Scratch s(ctx, sz.size());
    Carver c(s.data());
    int64_t* dgone = c.take<int64_t>(gone.size());
    int32_t* dlen = c.take<int32_t>(lists);
    copy_to_device(ctx, dgone, gone.data(), gone.size() * sizeof(int64_t));
    launch_remove_ids(code_ptrs.as<uint8_t* const>(), id_ptrs.as<int64_t* const>(), vt_ptrs.as<float* const>(),
                      vec_ptrs.as<float* const>(), key_ptrs.as<int64_t* const>(), lens.as<int32_t>(),
                      static_cast<int64_t>(lists), static_cast<int>(m), static_cast<int>(d), dgone,
                      static_cast<int64_t>(gone.size()), dlen, interleaved, ctx.impl().stream);
    std::vector<int32_t> kept(lists);
    copy_to_host(ctx, kept.data(), dlen, lists * sizeof(int32_t));  // waits
    size_t removed = 0;
    for (size_t l = 0; l < lists; ++l) {
        removed += lst[l].size - static_cast<size_t>(kept[l]);
        lst[l].size = static_cast<size_t>(kept[l]);
    }
    // Recounted, not updated: no rounding drift over many removals.
    ntotal_sq = 0;
    for (size_t l = 0; l < lists; ++l)
        ntotal_sq += double(lst[l].size) * double(lst[l].size);
    ntotal -= removed;
    if (removed)
        upload_meta();
    ctx.synchronize();
    return removed;
}

namespace {
template <typename F>
size_t sum_lists(const std::vector<ListStore::List>& lst, F f)
{
    size_t b = 0;
    for (const auto& L : lst)
        b += f(L).bytes();
    return b;
}
}  // namespace

size_t ListStore::code_bytes() const { return sum_lists(lst, [](const List& L) -> const DeviceBuffer& { return L.codes; }); }
size_t ListStore::id_bytes() const { return sum_lists(lst, [](const List& L) -> const DeviceBuffer& { return L.ids; }); }
size_t ListStore::vt_bytes() const { return sum_lists(lst, [](const List& L) -> const DeviceBuffer& { return L.vt; }); }
size_t ListStore::vector_bytes() const
{
    return sum_lists(lst, [](const List& L) -> const DeviceBuffer& { return L.vecs; });
}
size_t ListStore::key_bytes() const { return sum_lists(lst, [](const List& L) -> const DeviceBuffer& { return L.keys; }); }
size_t ListStore::meta_bytes() const
{
    return code_ptrs.bytes() + id_ptrs.bytes() + vt_ptrs.bytes() + vec_ptrs.bytes() + key_ptrs.bytes() + lens.bytes();
}

}  // namespace gpuivfpq::gpu
