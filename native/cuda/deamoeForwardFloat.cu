// The DeaMoE kernels for float (see deamoeForward.cuh); one file per dtype so they build in parallel.
#include "deamoeForward.cuh"

namespace deamoe
{
namespace detail
{

TypedOps const& typedOpsFloat()
{
    return typedOps<float>();
}

} // namespace detail
} // namespace deamoe
