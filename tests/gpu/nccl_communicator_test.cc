// The NCCL Communicator with one rank (the GPU a task is lent): every collective's result and
// the abort path. Skipped without a GPU. Several ranks need several GPUs; run.sh runs this test
// on whatever the machine has, and a multi-GPU test is to be added with such a machine.
#include "engine/parallel/nccl_communicator.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::Download;
using ::ridgeserve::testing::Upload;

TEST(NcclCommunicatorTest, OneRankCollectivesAndAbort) {
  RS_REQUIRE_CUDA_DEVICE();
  std::unique_ptr<Backend> backend = ::ridgeserve::testing::MakeCudaBackend();
  ASSERT_NE(backend, nullptr);
  Backend* ranks[] = {backend.get()};
  absl::StatusOr<std::unique_ptr<NcclCommunicatorGroup>> group =
      NcclCommunicatorGroup::Create(ranks);
  ASSERT_TRUE(group.ok()) << group.status();
  Communicator& comm = (*group)->rank(0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.rank(), 0);

  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};
  DeviceBuffer data = Upload(*backend, values);
  ASSERT_TRUE(comm.AllReduceSum(data.as<float>(), values.size()).ok());
  EXPECT_EQ(Download<float>(*backend, data, values.size()), values);

  DeviceBuffer gathered = Upload(*backend, std::vector<float>(values.size(), 0.0f));
  ASSERT_TRUE(comm.AllGather(data.as<float>(), values.size(), gathered.as<float>()).ok());
  EXPECT_EQ(Download<float>(*backend, gathered, values.size()), values);

  ASSERT_TRUE(comm.Broadcast(data.as<void>(), sizeof(float) * values.size(), 0).ok());
  EXPECT_EQ(Download<float>(*backend, data, values.size()), values);
  EXPECT_EQ(comm.Broadcast(data.as<void>(), 4, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(comm.Barrier().ok());

  comm.Abort("rank 0 failed a step");
  for (const absl::Status& s : {comm.AllReduceSum(data.as<float>(), values.size()), comm.Barrier(),
                                comm.AllGather(data.as<float>(), 1, gathered.as<float>())}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
    EXPECT_NE(s.message().find("rank 0 failed a step"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace ridgeserve
