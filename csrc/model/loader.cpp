#include "model/loader.h"

#include "model/ggml_support.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>

#include "ggml-alloc.h"
#include "ggml-cpu.h"
#include "gguf.h"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define FUN_ASR_HAVE_MMAP 1
#endif

namespace fun_asr {

MappedFile::MappedFile(const std::string & path) {
#ifdef FUN_ASR_HAVE_MMAP
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        ::close(fd);
        throw std::runtime_error(path + ": cannot stat");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        void * p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) throw std::runtime_error(path + ": mmap failed");
        data_ = static_cast<uint8_t *>(p);
    } else {
        ::close(fd);
    }
#else
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error(path + ": cannot open");
    std::fseek(f, 0, SEEK_END);
    size_ = static_cast<size_t>(std::ftell(f));
    std::fseek(f, 0, SEEK_SET);
    fallback_.resize(size_);
    const size_t got = std::fread(fallback_.data(), 1, size_, f);
    std::fclose(f);
    if (got != size_) throw std::runtime_error(path + ": short read");
    data_ = fallback_.data();
#endif
}

void MappedFile::release(const void * p, size_t n) const {
#ifdef FUN_ASR_HAVE_MMAP
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (data_ != nullptr && end > begin) madvise(reinterpret_cast<void *>(begin), end - begin, MADV_DONTNEED);
#else
    (void) p;
    (void) n;
#endif
}

MappedFile::~MappedFile() {
#ifdef FUN_ASR_HAVE_MMAP
    if (data_ != nullptr && size_ > 0) ::munmap(data_, size_);
#endif
}

namespace {

constexpr size_t kMaxMetaArray = 1 << 16;  // longer metadata arrays are not materialized (none is read)

MetaValue read_kv(const gguf_context * g, int64_t id, const std::string & key) {
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8: return static_cast<int64_t>(gguf_get_val_u8(g, id));
        case GGUF_TYPE_INT8: return static_cast<int64_t>(gguf_get_val_i8(g, id));
        case GGUF_TYPE_UINT16: return static_cast<int64_t>(gguf_get_val_u16(g, id));
        case GGUF_TYPE_INT16: return static_cast<int64_t>(gguf_get_val_i16(g, id));
        case GGUF_TYPE_UINT32: return static_cast<int64_t>(gguf_get_val_u32(g, id));
        case GGUF_TYPE_INT32: return static_cast<int64_t>(gguf_get_val_i32(g, id));
        case GGUF_TYPE_UINT64: return static_cast<int64_t>(gguf_get_val_u64(g, id));
        case GGUF_TYPE_INT64: return gguf_get_val_i64(g, id);
        case GGUF_TYPE_FLOAT32: return static_cast<double>(gguf_get_val_f32(g, id));
        case GGUF_TYPE_FLOAT64: return gguf_get_val_f64(g, id);
        case GGUF_TYPE_BOOL: return gguf_get_val_bool(g, id);
        case GGUF_TYPE_STRING: return std::string(gguf_get_val_str(g, id));
        case GGUF_TYPE_ARRAY: {
            const auto at = gguf_get_arr_type(g, id);
            const size_t n = gguf_get_arr_n(g, id);
            if (n > kMaxMetaArray) return std::string("<array>");  // not used by the loader (token lists ...)
            std::vector<int64_t> v;
            const void * d = at == GGUF_TYPE_STRING ? nullptr : gguf_get_arr_data(g, id);
            for (size_t i = 0; i < n; ++i) {
                switch (at) {
                    case GGUF_TYPE_INT32: v.push_back(static_cast<const int32_t *>(d)[i]); break;
                    case GGUF_TYPE_UINT32: v.push_back(static_cast<const uint32_t *>(d)[i]); break;
                    case GGUF_TYPE_INT64: v.push_back(static_cast<const int64_t *>(d)[i]); break;
                    case GGUF_TYPE_UINT64: v.push_back(static_cast<int64_t>(static_cast<const uint64_t *>(d)[i])); break;
                    default: return std::string("<array>");  // not used by the loader
                }
            }
            return v;
        }
        default: return std::string("<" + key + ">");
    }
}

// A bounds-checked walk over a GGUF header (magic, counts, every key/value, every tensor record) before
// ggml parses it. ggml's parser trusts a few things that a hostile file controls and then aborts or divides
// by zero: a zero dimension (`INT64_MAX / ne[1]` in gguf.cpp), an empty key (GGML_ASSERT in gguf_kv), a
// `general.alignment` that is not a uint32 (GGML_ASSERT in gguf_get_val_u32). This walk refuses those with a
// std::runtime_error naming the problem, and anything else malformed the same way (no read goes past `size`).
class HeaderWalk {
public:
    HeaderWalk(const uint8_t * data, size_t size, const std::string & path) : p_(data), size_(size), path_(path) {}

    void check() {
        if (size_ < 4 || std::memcmp(p_, "GGUF", 4) != 0) fail("bad magic (not a GGUF file)");
        pos_ = 4;
        const uint32_t version = u32();
        if (version < 2 || version > 3) fail("GGUF version " + std::to_string(version) + " is not supported (2 or 3)");
        const uint64_t n_tensors = u64();
        const uint64_t n_kv = u64();
        // every record takes at least 8 (tensors: 8 + 4 + 4 + 8) bytes, so counts beyond that cannot fit
        if (n_tensors > size_ / 24 || n_kv > size_ / 12) {
            fail("header declares " + std::to_string(n_tensors) + " tensors and " + std::to_string(n_kv) +
                 " metadata keys, more than a file of " + std::to_string(size_) + " bytes can hold");
        }
        for (uint64_t i = 0; i < n_kv; ++i) check_kv(i);
        for (uint64_t i = 0; i < n_tensors; ++i) check_tensor_record();
    }

private:
    // Metadata record i: a non-empty key, a known type, a value inside the file.
    void check_kv(uint64_t i) {
        const std::string key = str("metadata key");
        if (key.empty()) fail("metadata key " + std::to_string(i) + " is empty");  // a GGML_ASSERT in gguf.cpp
        uint32_t type = u32();
        uint64_t n = 1;
        const bool array = type == GGUF_TYPE_ARRAY;
        if (array) {
            type = u32();
            n = u64();
            if (type == GGUF_TYPE_ARRAY) fail("metadata key '" + key + "' is an array of arrays");
        }
        if (type >= GGUF_TYPE_COUNT) fail("metadata key '" + key + "' has unknown type " + std::to_string(type));
        if (key == GGUF_KEY_GENERAL_ALIGNMENT) {
            check_alignment(array, type);
            return;
        }
        if (type == GGUF_TYPE_STRING) {
            for (uint64_t j = 0; j < n; ++j) skip(u64(), "string value of '" + key + "'");
        } else {
            const size_t each = value_size(type);
            if (each == 0 || n > (size_ - pos_) / each) {
                fail("metadata key '" + key + "' runs past the end of the file");
            }
            pos_ += static_cast<size_t>(n) * each;
        }
    }
    // general.alignment's value: a uint32 power of 2 (ggml asserts the type and divides by it).
    void check_alignment(bool array, uint32_t type) {
        if (array || type != GGUF_TYPE_UINT32) fail("general.alignment must be a uint32");
        const uint32_t a = u32();
        if (a == 0 || (a & (a - 1)) != 0) {
            fail("general.alignment " + std::to_string(a) + " is not a power of 2");
        }
    }
    // One tensor record: its name, 1 to GGML_MAX_DIMS positive dimensions (their product in 64 bits), a known type.
    void check_tensor_record() {
        const std::string name = str("tensor name");
        if (name.empty() || name.size() >= GGML_MAX_NAME) {
            fail("tensor name '" + name.substr(0, 80) + "' is empty or longer than " +
                 std::to_string(GGML_MAX_NAME - 1) + " bytes");
        }
        const uint32_t n_dims = u32();
        if (n_dims < 1 || n_dims > GGML_MAX_DIMS) {
            fail("tensor '" + name + "' has " + std::to_string(n_dims) + " dimensions (accepted: 1 to " +
                 std::to_string(GGML_MAX_DIMS) + ")");
        }
        int64_t numel = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const int64_t ne = static_cast<int64_t>(u64());
            if (ne <= 0) {
                fail("tensor '" + name + "' dimension " + std::to_string(d) + " is " + std::to_string(ne) +
                     " (must be > 0)");
            }
            if (ne > INT64_MAX / numel) fail("tensor '" + name + "' has more elements than fit in 64 bits");
            numel *= ne;
        }
        const uint32_t type = u32();
        if (type >= GGML_TYPE_COUNT || ggml_blck_size(static_cast<ggml_type>(type)) <= 0 ||
            ggml_type_size(static_cast<ggml_type>(type)) == 0) {
            fail("tensor '" + name + "' has unknown ggml type id " + std::to_string(type));
        }
        u64();  // offset: checked against the file size once ggml has computed the data section
    }

    static size_t value_size(uint32_t type) {  // bytes of one value of a fixed-size GGUF type, 0 otherwise
        switch (type) {
            case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
            case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
            case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
            case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
            default: return 0;
        }
    }
    [[noreturn]] void fail(const std::string & why) const {
        throw std::runtime_error(path_ + ": not a valid GGUF file: " + why);
    }
    void need(size_t n) const {
        if (n > size_ - pos_) {
            fail("truncated header (needs " + std::to_string(n) + " more bytes at offset " + std::to_string(pos_) + ")");
        }
    }
    template <typename T> T read() {
        need(sizeof(T));
        T v;
        std::memcpy(&v, p_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    uint32_t u32() { return read<uint32_t>(); }
    uint64_t u64() { return read<uint64_t>(); }
    void skip(uint64_t n, const std::string & what) {
        if (n > size_ - pos_) fail(what + " runs past the end of the file");
        pos_ += static_cast<size_t>(n);
    }
    std::string str(const char * what) {
        const uint64_t n = u64();
        if (n > size_ - pos_) fail(std::string(what) + " runs past the end of the file");
        std::string s(reinterpret_cast<const char *>(p_ + pos_), static_cast<size_t>(n));
        pos_ += static_cast<size_t>(n);
        return s;
    }

    const uint8_t * p_;
    size_t size_;
    size_t pos_ = 0;
    const std::string & path_;
};

}  // namespace

ModelSource read_gguf(const std::string & path) {
    ModelSource src;
    src.origin = path;
    src.file = std::make_shared<MappedFile>(path);
    HeaderWalk(src.file->data(), src.file->size(), path).check();
    ggml_context * meta_ctx = nullptr;
    gguf_init_params params{/*no_alloc=*/true, /*ctx=*/&meta_ctx};
    take_ggml_error();  // drop anything older than this call
    gguf_context * g = gguf_init_from_file(path.c_str(), params);
    if (g == nullptr) {
        const std::string why = take_ggml_error();
        throw std::runtime_error(path + ": not a valid GGUF file (bad magic, version, or truncated header" +
                                 (why.empty() ? std::string() : "; ggml: " + why) + ")");
    }
    struct Guard {
        gguf_context * g;
        ggml_context * c;
        ~Guard() {
            gguf_free(g);
            if (c) ggml_free(c);
        }
    } guard{g, meta_ctx};

    for (int64_t i = 0; i < gguf_get_n_kv(g); ++i) {
        const std::string key = gguf_get_key(g, i);
        src.meta[key] = read_kv(g, i, key);
    }
    auto arch = src.meta.find("general.architecture");
    if (arch == src.meta.end() || !std::holds_alternative<std::string>(arch->second)) {
        throw std::runtime_error(path + ": GGUF has no general.architecture");
    }
    src.arch = std::get<std::string>(arch->second);

    const size_t data_offset = gguf_get_data_offset(g);
    const size_t file_size = src.file->size();
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        SourceTensor t;
        t.name = gguf_get_tensor_name(g, i);
        ggml_tensor * meta = ggml_get_tensor(meta_ctx, t.name.c_str());
        t.type = meta->type;
        for (int d = 0; d < ggml_n_dims(meta); ++d) t.ne.push_back(meta->ne[d]);
        t.nbytes = ggml_nbytes(meta);
        // data_offset + offset + nbytes <= file_size, without letting a sum wrap around
        const size_t rel = gguf_get_tensor_offset(g, i);
        if (data_offset > file_size || rel > file_size - data_offset || t.nbytes > file_size - data_offset - rel) {
            throw std::runtime_error(path + ": truncated or corrupt: tensor '" + t.name + "' (" +
                                     std::to_string(t.nbytes) + " bytes at offset " + std::to_string(rel) +
                                     " of the data section at byte " + std::to_string(data_offset) +
                                     ") lies past the end of the file (" + std::to_string(file_size) + " bytes)");
        }
        const size_t off = data_offset + rel;
        t.data = src.file->data() + off;
        src.tensors.push_back(std::move(t));
    }
    return src;
}

LoadedWeights::~LoadedWeights() {
    if (lookup_buffer) ggml_backend_buffer_free(lookup_buffer);
    if (host_buffer) ggml_backend_buffer_free(host_buffer);
    if (repack_buffer) ggml_backend_buffer_free(repack_buffer);
    if (quads_buffer) ggml_backend_buffer_free(quads_buffer);
    if (buffer) ggml_backend_buffer_free(buffer);
    if (ctx) ggml_free(ctx);
}

namespace {

std::string shape_str(const std::vector<int64_t> & ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

bool type_allowed(const std::string & kind, ggml_type t) {
    if (kind == "norm" || kind == "bias" || kind == "fsmn") return t == GGML_TYPE_F32;
    switch (t) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_K: case GGML_TYPE_Q6_K: return true;
        default: return false;
    }
}

}  // namespace

// The CPU backend's extra buffer types (ggml's "repack": Q4_K/Q4_0/IQ4_NL in interleaved layouts
// with faster GEMM kernels). A weight goes there when that buffer type supports a matmul with it;
// the question is asked the way llama.cpp asks it: a dummy mul_mat op with the weight in an
// empty buffer of that type. Only ggml's "CPU_REPACK" type is used: the AMX buffer type (present
// when the build targets a CPU with AMX) segfaults in ggml 0.15.3's AMX mul_mat on our shapes
// (seen on a Sapphire Rapids VM: Q8_0 encoder, tests/test_batch.py), so it is never chosen.
ggml_backend_buffer_type_t repack_buft_for(ggml_backend_dev_t dev, const ggml_tensor * w) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    if (!get_extra || ggml_n_dims(w) != 2) return nullptr;
    for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; ++b) {
        if (std::string(ggml_backend_buft_name(*b)) != "CPU_REPACK") continue;
        ggml_init_params ip{ggml_tensor_overhead() * 4, nullptr, true};
        ggml_context * ctx = ggml_init(ip);
        ggml_tensor * wt = ggml_new_tensor_2d(ctx, w->type, w->ne[0], w->ne[1]);
        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 16);
        ggml_tensor * op = ggml_mul_mat(ctx, wt, x);
        ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*b, 0);
        wt->buffer = dummy;
        const bool ok = ggml_backend_dev_supports_op(dev, op);
        wt->buffer = nullptr;
        ggml_backend_buffer_free(dummy);
        ggml_free(ctx);
        if (ok) return *b;
    }
    return nullptr;
}

namespace {

using Placed = std::vector<std::pair<ggml_tensor *, const SourceTensor *>>;

// One weights buffer of `buft` for `list`'s tensors (at least `min_bytes`), each tensor placed in it and
// then filled by fill(tensor, source); `no_buffer` / `no_room`: the messages when that fails. `in_ram`: the
// buffer is this process's memory (a CPU buffer, ggml's repacked ones included).
template <typename Fill>
ggml_backend_buffer_t place_weights(ggml_backend_buffer_type_t buft, const Placed & list, size_t min_bytes, bool in_ram,
                                    const std::string & no_buffer, const std::string & no_room, const Fill & fill) {
    size_t total = 0;
    for (auto & [t, s] : list) total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), ggml_backend_buft_get_alignment(buft));
    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(buft, std::max(total, min_bytes));
    if (!buffer) throw std::runtime_error(no_buffer);
    ggml_backend_buffer_set_usage(buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    // Transparent huge pages for the weights this process holds (the re-laid-out and repacked matrices: every
    // decode step streams them whole). With 4 KiB pages each page of a 0.6-0.9 GB read is a TLB miss; with
    // 2 MiB pages the full-size Q8_0 decode step took 8.9-9.1 instead of 9.3-10.0 ms on Zen 5
    // (docs/performance.md).
    if (in_ram) advise_huge_pages(buffer);
    ggml_tallocr talloc = ggml_tallocr_new(buffer);
    for (auto & [t, s] : list) {
        if (ggml_tallocr_alloc(&talloc, t) != GGML_STATUS_SUCCESS) {
            ggml_backend_buffer_free(buffer);
            throw std::runtime_error(no_room);
        }
        fill(t, s);
    }
    return buffer;
}

// Whether `dev` runs ggml's GET_ROWS on the matrix w (ggml's Vulkan backend has no K-quant lookups), or its
// product with a column (a device refuses a tensor larger than it can bind: Mesa's lavapipe above 128 MiB).
bool device_runs(ggml_backend_dev_t dev, ggml_tensor * w, bool lookup) {
    return device_supports(dev, 2, [&](ggml_context * ctx) {
        return std::vector<ggml_tensor *>{
            lookup ? ggml_get_rows(ctx, w, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1))
                   : ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 1))};
    });
}

}  // namespace

namespace {

// The source's tensors that belong to the ASR model. A package may carry its FSMN-VAD (tensors "vad.*", keys
// "fsmn_vad.*": VadModel loads those) and its CAM++ speaker model (tensors "spk.*", keys "campplus.*":
// SpeakerModel loads those).
std::vector<const SourceTensor *> own_tensors(const ModelSource & src) {
    const bool embedded_vad = src.meta.count("fsmn_vad.block_count") > 0;
    const bool embedded_spk = src.meta.count("campplus.embedding_length") > 0;
    std::vector<const SourceTensor *> own;
    for (const auto & t : src.tensors) {
        if (embedded_vad && t.name.rfind("vad.", 0) == 0) continue;
        if (embedded_spk && t.name.rfind("spk.", 0) == 0) continue;
        own.push_back(&t);
    }
    return own;
}

// The expected tensor e as the file has it: its shape, an allowed type, its data size.
void check_tensor(const ModelSource & src, const ExpectedTensor & e, const SourceTensor & t) {
    if (t.ne != e.ne) {
        throw std::runtime_error(src.origin + ": tensor '" + e.name + "' has shape " + shape_str(t.ne) +
                                 ", expected " + shape_str(e.ne) + " (ggml order)");
    }
    if (!type_allowed(e.kind, t.type)) {
        throw std::runtime_error(src.origin + ": tensor '" + e.name + "' has unsupported type " +
                                 ggml_type_name(t.type) + " for a " + e.kind);
    }
    size_t want = t.ne[0] % ggml_blck_size(t.type) == 0 ? ggml_row_size(t.type, t.ne[0]) : 0;
    for (size_t d = 1; d < t.ne.size(); ++d) want *= static_cast<size_t>(t.ne[d]);
    if (want == 0 || t.nbytes != want) {
        throw std::runtime_error(src.origin + ": tensor '" + e.name + "' data size does not match its type");
    }
}

// Every expected tensor present and as expected, and no other.
void check_tensors(const ModelSource & src, const std::vector<ExpectedTensor> & expected,
                   const std::vector<const SourceTensor *> & own,
                   const std::map<std::string, const SourceTensor *> & by_name) {
    for (const auto & e : expected) {
        auto it = by_name.find(e.name);
        if (it == by_name.end()) throw std::runtime_error(src.origin + ": missing tensor '" + e.name + "'");
        check_tensor(src, e, *it->second);
    }
    if (own.size() != expected.size()) {
        std::map<std::string, bool> known;
        for (const auto & e : expected) known[e.name] = true;
        for (const SourceTensor * t : own) {
            if (!known.count(t->name)) throw std::runtime_error(src.origin + ": unexpected tensor '" + t->name + "'");
        }
        throw std::runtime_error(src.origin + ": duplicate tensor names");
    }
}

// The weights' tensors (metadata only) in out->ctx, each with its source.
Placed new_weight_tensors(LoadedWeights & out, const std::vector<ExpectedTensor> & expected,
                          std::map<std::string, const SourceTensor *> & by_name) {
    Placed pairs;
    for (const auto & e : expected) {
        const SourceTensor & s = *by_name[e.name];
        int64_t ne[4] = {1, 1, 1, 1};
        for (size_t d = 0; d < s.ne.size(); ++d) ne[d] = s.ne[d];
        ggml_tensor * t = ggml_new_tensor(out.ctx, s.type, static_cast<int>(s.ne.size()), ne);
        ggml_set_name(t, e.name.c_str());
        pairs.emplace_back(t, &s);
        out.bytes += s.nbytes;
    }
    return pairs;
}

// Matrices the CPU can repack for faster GEMM get their own buffer (a copy, re-laid out); they leave pairs.
void place_repacked(LoadedWeights & out, const ModelSource & src, ggml_backend_dev_t dev, Placed & pairs) {
    Placed repack, rest;
    ggml_backend_buffer_type_t repack_buft = nullptr;
    for (auto & pr : pairs) {
        ggml_backend_buffer_type_t b = pr.first->name != std::string("token_embd.weight")  // get_rows reads it
                                           ? repack_buft_for(dev, pr.first) : nullptr;
        if (b && (!repack_buft || b == repack_buft)) {
            repack_buft = b;
            repack.push_back(pr);
        } else {
            rest.push_back(pr);
        }
    }
    pairs.swap(rest);
    if (repack.empty()) return;
    out.repack_buffer = place_weights(repack_buft, repack, 0, true, "cannot allocate the repacked weights",
                                      "repack allocation failed", [&](ggml_tensor * t, const SourceTensor * s) {
                                          ggml_backend_tensor_set(t, s->data, 0, s->nbytes);  // the buffer re-lays the data out
                                          if (src.file) src.file->release(s->data, s->nbytes);  // the mapped original is not needed any more
                                      });
    out.repacked = repack.size();
}

// The matrices of the decoder, encoder, adaptor and CTC head that a CPU kernel takes in its own layout (the int8
// GEMM's Q8_0 quads): re-laid out once here instead of once per product (a decode step unpacked every matrix it
// read). The same bytes, in this process's memory instead of the shared page cache. (The encoder's products have
// 50+ columns, so their unpack was a small share with 256-bit tiles, 168 vs 170 ms per 10 s pass on Zen 4; with
// the 512-bit ones on Zen 5 a 5 s pass takes 56 instead of 59 ms.) Only graph/common.cpp's products read these
// names' matrices (never a ggml op: the VAD's and the speaker model's own weights keep their layout). They leave
// pairs.
void place_quads(LoadedWeights & out, const ModelSource & src, ggml_backend_dev_t dev, bool tied,
                 const WeightRelayout & relayout, Placed & pairs) {
    Placed quads, rest;
    for (auto & pr : pairs) {
        // (the token embedding when tied: the output projection's matrix, its lookups through get_rows)
        const std::string name = pr.first->name;
        const auto starts = [&](const char * prefix) { return name.rfind(prefix, 0) == 0; };
        const bool matrix = starts("blk.") || starts("enc.blk.") || starts("adp.") || starts("ctc.") ||
                            name == "output.weight" || (name == "token_embd.weight" && tied);
        (matrix && relayout.fits(pr.first) ? quads : rest).push_back(pr);
    }
    if (quads.empty()) return;
    out.quads_buffer = place_weights(ggml_backend_dev_buffer_type(dev), quads, 0, true,
                                     "cannot allocate the re-laid-out Q8_0 weights", "weight allocation failed",
                                     [&](ggml_tensor * t, const SourceTensor * s) {
                                         relayout.apply(t, s->data);
                                         if (src.file) src.file->release(s->data, s->nbytes);
                                     });
    out.quads = quads.size();
    pairs.swap(rest);
}

// Weights stay in the page cache: the buffer wraps the mapped file, tensors point into it (where every tensor's
// data is aligned).
void wrap_mapped_file(LoadedWeights & out, const ModelSource & src, const Placed & pairs) {
    const size_t align = 32;
    bool aligned = true;
    for (auto & [t, s] : pairs) aligned &= (reinterpret_cast<uintptr_t>(s->data) % align) == 0;
    if (!aligned) return;
    out.file = src.file;
    out.buffer = ggml_backend_dev_buffer_from_host_ptr(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU),
                                                       const_cast<uint8_t *>(src.file->data()), src.file->size(),
                                                       src.file->size());
    for (auto & [t, s] : pairs) {
        if (ggml_backend_tensor_alloc(out.buffer, t, const_cast<void *>(s->data)) != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("cannot place tensor '" + std::string(t->name) + "'");
        }
    }
    ggml_backend_buffer_set_usage(out.buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    out.mmapped = true;
}

void copy_weight(ggml_tensor * t, const SourceTensor * s) { ggml_backend_tensor_set(t, s->data, 0, s->nbytes); }

// Matrices the device cannot multiply (too large for it to bind) stay in host memory: their products run on the
// CPU, the rest of the graph on the device. They leave pairs.
void place_host_matrices(LoadedWeights & out, ggml_backend_dev_t dev, ggml_backend_buffer_type_t host_buft,
                         Placed & pairs) {
    Placed host, rest;
    for (auto & pr : pairs) {
        const bool matrix = ggml_n_dims(pr.first) == 2;
        (matrix && !device_runs(dev, pr.first, false) ? host : rest).push_back(pr);
    }
    if (host.empty()) return;
    out.host_buffer = place_weights(host_buft, host, 0, true, "cannot allocate the host-side weights",
                                    "weight allocation failed", copy_weight);
    for (auto & pr : host) out.host_weights.push_back(pr.first);
    pairs.swap(rest);
}

// The token ids' lookups on the CPU, from a host copy (the graph hands the rows over to the device); the
// device's copy stays the output projection's matrix when tied.
void place_token_lookup(LoadedWeights & out, ggml_backend_buffer_type_t host_buft, const SourceTensor * tok_embd) {
    ggml_tensor * host = ggml_dup_tensor(out.ctx, out.w.tok_embd);
    ggml_set_name(host, "token_embd.weight.lookup");
    out.lookup_buffer = place_weights(host_buft, {{host, tok_embd}}, 0, true,
                                      "cannot allocate the token embedding's host copy",
                                      "token embedding allocation failed", copy_weight);
    out.w.tok_lookup = host;
    out.host_token_lookup = true;
}

}  // namespace

std::unique_ptr<LoadedWeights> load_weights(const ModelSource & src, const HParams & hp, ggml_backend_dev_t dev,
                                            const WeightRelayout * relayout) {
    const std::vector<ExpectedTensor> expected = expected_tensors(hp);
    const std::vector<const SourceTensor *> own = own_tensors(src);
    std::map<std::string, const SourceTensor *> by_name;
    for (const SourceTensor * t : own) by_name[t->name] = t;
    check_tensors(src, expected, own, by_name);

    auto out = std::make_unique<LoadedWeights>();
    ggml_init_params ip{ggml_tensor_overhead() * (expected.size() + 8), nullptr, /*no_alloc=*/true};
    out->ctx = ggml_init(ip);
    if (!out->ctx) throw std::runtime_error("ggml_init failed");
    Placed pairs = new_weight_tensors(*out, expected, by_name);

    const bool is_cpu = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    if (is_cpu) place_repacked(*out, src, dev, pairs);
    if (is_cpu && relayout) place_quads(*out, src, dev, hp.dec.tie_embeddings, *relayout, pairs);
    if (is_cpu && src.file && src.file->size() > 0) wrap_mapped_file(*out, src, pairs);
    ggml_backend_buffer_type_t host_buft = ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
    if (!is_cpu) place_host_matrices(*out, dev, host_buft, pairs);
    if (!out->mmapped) {
        out->buffer = place_weights(ggml_backend_dev_buffer_type(dev), pairs, 1, is_cpu,
                                    "cannot allocate " + std::to_string(out->bytes) + " bytes for the weights",
                                    "weight allocation failed", copy_weight);
    }
    out->w = bind_weights(out->ctx, hp);
    out->host_token_lookup = std::find(out->host_weights.begin(), out->host_weights.end(), out->w.tok_embd) !=
                             out->host_weights.end();
    if (!is_cpu && !out->host_token_lookup && !device_runs(dev, out->w.tok_embd, true)) {
        place_token_lookup(*out, host_buft, by_name["token_embd.weight"]);
    }
    return out;
}

}  // namespace fun_asr
