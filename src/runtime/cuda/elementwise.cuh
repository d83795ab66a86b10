// The elementwise loop on CUDA devices: the same contract as elementwise.h's host loop (outputs
// fresh and contiguous with the broadcast shape, inputs read as their storage types and passed to
// the functor as compute types, one pass writing every output), run on the current stream of the
// tensors' device.
//
// Three kernels, chosen once per call: every input contiguous with the output's size (vectorized
// loads and stores of 4 elements where the pointers allow, two such loads in flight per thread, one
// output); inputs contiguous or of one element (a step of 1 or 0); otherwise broadcasting or
// strided inputs, whose index math (dimensions merged where every operand is contiguous across
// them, each input's strides) is computed once per call on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <utility>

#include "runtime/cuda/cuda_utils.cuh"
#include "runtime/elementwise.h"

namespace opforge::cuda {

constexpr int kMaxDims = 12;  // of the strided kernel's index math, after merging dimensions
constexpr int kThreads = 256;
constexpr int kVec = 4;       // elements per vectorized load/store

namespace detail {

template <size_t N>
struct InPtrs {
  const void* p[N > 0 ? N : 1];
};

template <size_t N>
struct Steps {
  int64_t s[N > 0 ? N : 1];
};

// The output's shape and each input's strides in elements (0 on broadcast dimensions).
template <size_t N>
struct Strided {
  int nd;
  int64_t sizes[kMaxDims];
  int64_t strides[N > 0 ? N : 1][kMaxDims];
};

// Where the kernels write: one pointer per output; put() stores the value, or one value per output.
template <typename Outs, typename K = std::make_index_sequence<std::tuple_size_v<Outs>>>
struct Sink;

template <typename... Out, size_t... K>
struct Sink<std::tuple<Out...>, std::index_sequence<K...>> {
  void* p[sizeof...(Out)];
  template <typename R>
  __device__ __forceinline__ void put(int64_t i, const R& r) const {
    if constexpr (sizeof...(Out) == 1) {
      ((static_cast<Out*>(p[K])[i] = convert<Out>(r)), ...);
    } else {
      ((static_cast<Out*>(p[K])[i] = convert<Out>(std::get<K>(r))), ...);
    }
  }
};

template <typename In>
__device__ __forceinline__ compute_t<In> load(const void* p, int64_t i) {
  return convert<compute_t<In>>(static_cast<const In*>(p)[i]);
}

template <typename T>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

__device__ __forceinline__ int64_t thread_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t(blockDim.x) * gridDim.x; }

template <typename Ins, size_t K>
using In_t = std::tuple_element_t<K, Ins>;

// f of every input (types Ins = std::tuple<In...>) read at its offset
template <typename Ins, typename F, size_t... I>
__device__ __forceinline__ auto call_at(const F& f, const void* const* p, const int64_t* off, std::index_sequence<I...>) {
  return f(load<In_t<Ins, I>>(p[I], off[I])...);
}

// kVec elements of every input at chunk c (aligned vector loads)
template <typename Ins, size_t... I>
__device__ __forceinline__ std::tuple<Vec<In_t<Ins, I>>...> vec_load(const void* const* p, int64_t c,
                                                                      std::index_sequence<I...>) {
  return {reinterpret_cast<const Vec<In_t<Ins, I>>*>(p[I])[c]...};
}

// f of the loaded chunk into chunk c of out (an aligned vector store)
template <typename Out, typename Ins, typename F, typename L, size_t... I>
__device__ __forceinline__ void vec_store(const F& f, Out* out, const L& loaded, int64_t c, std::index_sequence<I...>) {
  Vec<Out> r;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    r.v[k] = convert<Out>(f(convert<compute_t<In_t<Ins, I>>>(std::get<I>(loaded).v[k])...));
  }
  reinterpret_cast<Vec<Out>*>(out)[c] = r;
}

// every input contiguous with n elements, one output, all pointers aligned to kVec elements:
// thread t handles the chunks t and t + stride (stride: the grid's threads), then t + 2 * stride
// and t + 3 * stride, ... of kVec elements, loading both chunks of a pair before computing either
// (twice the bytes in flight per thread: an op whose functor needs more than 32 registers, such as
// gelu, leaves fewer threads resident, and one load each would not keep the memory busy); the tail
// runs element by element
template <typename Out, typename F, typename Ins>
__global__ void vec_kernel(int64_t n, F f, Out* out, InPtrs<std::tuple_size_v<Ins>> in) {
  constexpr size_t N = std::tuple_size_v<Ins>;
  using Seq = std::make_index_sequence<N>;
  const int64_t chunks = n / kVec, stride = grid_stride();
  for (int64_t c = thread_index(); c < chunks; c += 2 * stride) {
    const int64_t c2 = c + stride;
    const bool two = c2 < chunks;
    const auto a = vec_load<Ins>(in.p, c, Seq{});
    const auto b = vec_load<Ins>(in.p, two ? c2 : c, Seq{});  // (the first again past the end: no branch)
    vec_store<Out, Ins>(f, out, a, c, Seq{});
    if (two) vec_store<Out, Ins>(f, out, b, c2, Seq{});
  }
  for (int64_t i = chunks * kVec + thread_index(); i < n; i += grid_stride()) {
    int64_t off[N > 0 ? N : 1];
#pragma unroll
    for (size_t k = 0; k < N; ++k) off[k] = i;
    out[i] = convert<Out>(call_at<Ins>(f, in.p, off, std::make_index_sequence<N>{}));
  }
}

// inputs contiguous (step 1) or of one element (step 0)
template <typename Outs, typename F, typename Ins>
__global__ void flat_kernel(int64_t n, F f, Sink<Outs> o, InPtrs<std::tuple_size_v<Ins>> in,
                            Steps<std::tuple_size_v<Ins>> step) {
  constexpr size_t N = std::tuple_size_v<Ins>;
  for (int64_t i = thread_index(); i < n; i += grid_stride()) {
    int64_t off[N > 0 ? N : 1];
#pragma unroll
    for (size_t k = 0; k < N; ++k) off[k] = i * step.s[k];
    o.put(i, call_at<Ins>(f, in.p, off, std::make_index_sequence<N>{}));
  }
}

// broadcasting and strided inputs
template <typename Outs, typename F, typename Ins>
__global__ void strided_kernel(int64_t n, F f, Sink<Outs> o, InPtrs<std::tuple_size_v<Ins>> in,
                               Strided<std::tuple_size_v<Ins>> g) {
  constexpr size_t N = std::tuple_size_v<Ins>;
  for (int64_t i = thread_index(); i < n; i += grid_stride()) {
    int64_t off[N > 0 ? N : 1] = {};
    int64_t rem = i;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t size = g.sizes[d];
      const int64_t idx = rem % size;
      rem /= size;
#pragma unroll
      for (size_t k = 0; k < N; ++k) off[k] += idx * g.strides[k][d];
    }
    o.put(i, call_at<Ins>(f, in.p, off, std::make_index_sequence<N>{}));
  }
}

inline unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, int64_t(1) << 20));
}

// The output's shape with size-1 dimensions dropped and neighbours merged where every input
// steps across them as across one dimension (the output is contiguous); RuntimeError naming op
// beyond kMaxDims.
template <size_t N>
Strided<N> merged(const char* op, const Shape& shape, const std::array<Shape, N>& strides) {
  Strided<N> g{};
  g.nd = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = g.nd > 0;
    for (size_t k = 0; k < N && merge; ++k) merge = strides[k][d] * shape[d] == g.strides[k][g.nd - 1];
    if (merge) {  // (the previous dimension steps by this one's whole extent: one dimension)
      g.sizes[g.nd - 1] *= shape[d];
      for (size_t k = 0; k < N; ++k) g.strides[k][g.nd - 1] = strides[k][d];
      continue;
    }
    if (g.nd == kMaxDims) {
      fail<RuntimeError>(op, "CUDA elementwise loop: more than ", kMaxDims, " dimensions remain after merging ",
                         "(shape ", shape_str(shape), ")");
    }
    g.sizes[g.nd] = shape[d];
    for (size_t k = 0; k < N; ++k) g.strides[k][g.nd] = strides[k][d];
    ++g.nd;
  }
  return g;
}

template <typename Outs, typename... In, typename F, size_t... I>
void elementwise_impl(const std::array<const Tensor*, std::tuple_size_v<Outs>>& outs, const F& f,
                      const std::array<const Tensor*, sizeof...(In)>& ins, std::index_sequence<I...>) {
  constexpr size_t N = sizeof...(In);
  const char* op = current_op() ? current_op() : "elementwise";
  const Shape& shape = outs[0]->shape();
  const Device device = outs[0]->device();
  for (size_t k = 0; k < outs.size(); ++k) {
    if (outs[k]->shape() != shape) fail<RuntimeError>(op, "elementwise output ", k, " has another shape");
    if (outs[k]->device() != device) fail<RuntimeError>(op, "elementwise output ", k, " is on another device");
  }
  ((ins[I]->device() == device ? void() : fail<RuntimeError>(op, "elementwise input ", I, " is on ",
                                                              ins[I]->device().str(), ", not ", device.str())), ...);
  (opforge::detail::check_input(I, *ins[I], shape), ...);
  const int64_t n = outs[0]->numel();
  if (n == 0) return;
  DeviceGuard guard(op, device.index);
  const cudaStream_t stream = current_stream(op, device);
  Sink<Outs> o{};
  for (size_t k = 0; k < outs.size(); ++k) o.p[k] = outs[k]->raw_data();
  const InPtrs<N> in{{ins[I]->raw_data()...}};
  if constexpr (std::tuple_size_v<Outs> == 1) {
    using Out = std::tuple_element_t<0, Outs>;
    const auto aligned = [](const void* p, size_t item) {
      return reinterpret_cast<uintptr_t>(p) % (item * kVec) == 0;
    };
    const bool same = ((ins[I]->numel() == n && ins[I]->is_contiguous()) && ... && true);
    if (same && aligned(o.p[0], sizeof(Out)) && (aligned(in.p[I], sizeof(In)) && ... && true)) {
      vec_kernel<Out, F, std::tuple<In...>><<<blocks_for((n / kVec + 1) / 2), kThreads, 0, stream>>>(
          n, f, static_cast<Out*>(o.p[0]), in);
      check(op, cudaGetLastError());
      return;
    }
  }
  const bool flat = (((ins[I]->numel() == n && ins[I]->is_contiguous()) || ins[I]->numel() == 1) && ... && true);
  if (flat) {
    const Steps<N> step{{(ins[I]->numel() == n ? int64_t(1) : int64_t(0))...}};
    flat_kernel<Outs, F, std::tuple<In...>><<<blocks_for(n), kThreads, 0, stream>>>(n, f, o, in, step);
  } else {
    const std::array<Shape, N> strides{broadcast_strides(*ins[I], shape)...};
    strided_kernel<Outs, F, std::tuple<In...>><<<blocks_for(n), kThreads, 0, stream>>>(
        n, f, o, in, merged<N>(op, shape, strides));
  }
  check(op, cudaGetLastError());
}

}  // namespace detail

// out[i] = f(in_0[i], ..., in_k[i]) with NumPy broadcasting, on out's device and current stream.
template <typename Out, typename... In, typename F>
void elementwise(const Tensor& out, const F& f, const std::array<const Tensor*, sizeof...(In)>& ins) {
  detail::elementwise_impl<std::tuple<Out>, In...>({&out}, f, ins, std::index_sequence_for<In...>{});
}

// The same loop writing several outputs in one pass (`Outs` = std::tuple<Out...>).
template <typename Outs, typename... In, typename F>
void elementwise_n(const std::array<const Tensor*, std::tuple_size_v<Outs>>& outs, const F& f,
                   const std::array<const Tensor*, sizeof...(In)>& ins) {
  detail::elementwise_impl<Outs, In...>(outs, f, ins, std::index_sequence_for<In...>{});
}

}  // namespace opforge::cuda
