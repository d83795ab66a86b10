// Kernel of op `embedding` on cuda: out[i, :] = weight[indices[i], :], a thread per 16 bytes of
// output where the rows allow (else per element). Indices are checked on the device (row_common.cuh's
// IndexCheck): a bad index copies nothing (its row is zeros) and the call raises IndexError.
#include "embedding.h"

#include "row_common.cuh"

namespace opforge::kernels::cuda {

namespace {

// units: elements (U = T) or 16-byte packs (U = Pack<T>) per row
template <typename U>
__global__ void gather_rows(int64_t n, int64_t units, int64_t rows, const int64_t* idx, const U* w, U* out,
                            unsigned long long* bad) {
  const int64_t total = n * units;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / units, c = e % units;
    const int64_t r = idx[i];
    out[e] = rows::index_ok(r, rows, i, bad) ? w[r * units + c] : U{};
  }
}

}  // namespace

template <typename T>
void embedding(const TensorPtr& indices, const TensorPtr& weight, const TensorPtr& out,
               const EmbeddingAttrs& /*attrs*/) {
  constexpr const char* op = "embedding";
  const int64_t rows = weight->shape()[0], dim = weight->shape()[1];
  const int64_t n = indices->numel();
  const Device dev = weight->device();
  if (indices->device() != dev) {
    fail<ValueError>(op, "indices are on ", indices->device().str(), " but weight on ", dev.str());
  }
  if (n == 0) return;
  const rows::IndexCheck chk(op, dev);
  {
    ::opforge::cuda::DeviceGuard guard(op, dev.index);
    const cudaStream_t stream = ::opforge::cuda::current_stream(op, dev);
    if (dim == 0) {  // (rows of no elements: the indices checked alone, as the cpu checks them)
      rows::check_indices<<<::opforge::cuda::detail::blocks_for(n), ::opforge::cuda::kThreads, 0, stream>>>(
          n, rows, indices->data<int64_t>(), chk.flag());
      ::opforge::cuda::check(op, cudaGetLastError());
      chk.raise_if_bad(indices->data<int64_t>(), "weight with " + std::to_string(rows) + " rows");
      return;
    }
    const bool vec = rows::vec_ok<T>(dim, {weight->raw_data(), out->raw_data()});
    const int64_t units = vec ? dim / rows::kPack<T> : dim;
    const unsigned blocks = ::opforge::cuda::detail::blocks_for(n * units);
    if (vec) {
      gather_rows<rows::Pack<T>><<<blocks, ::opforge::cuda::kThreads, 0, stream>>>(
          n, units, rows, indices->data<int64_t>(), static_cast<const rows::Pack<T>*>(weight->raw_data()),
          static_cast<rows::Pack<T>*>(out->raw_data()), chk.flag());
    } else {
      gather_rows<T><<<blocks, ::opforge::cuda::kThreads, 0, stream>>>(n, units, rows, indices->data<int64_t>(),
                                                                       weight->data<T>(), out->data<T>(), chk.flag());
    }
    ::opforge::cuda::check(op, cudaGetLastError());
  }
  chk.raise_if_bad(indices->data<int64_t>(), "weight with " + std::to_string(rows) + " rows");
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_EMBEDDING_CUDA
