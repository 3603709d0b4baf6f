// ExecutionBudget: slots and memory are handed out up to the limits and come
// back when tickets are destroyed or moved over.

#include "worker/execution_budget.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

TEST(ExecutionBudget, BoundsConcurrentExecutions) {
  ExecutionBudget budget(2, 1000);
  absl::StatusOr<ExecutionBudget::Ticket> a = budget.Admit();
  absl::StatusOr<ExecutionBudget::Ticket> b = budget.Admit();
  ASSERT_TRUE(a.ok() && b.ok());
  const absl::StatusOr<ExecutionBudget::Ticket> c = budget.Admit();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("2 executions"), std::string::npos)
      << c.status();
  *a = ExecutionBudget::Ticket();
  EXPECT_EQ(budget.executions(), 1);
  EXPECT_TRUE(budget.Admit().ok());
}

TEST(ExecutionBudget, BoundsMemoryAndReturnsIt) {
  ExecutionBudget budget(4, 1000);
  {
    absl::StatusOr<ExecutionBudget::Ticket> a = budget.Admit();
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->Reserve(600).ok());
    absl::StatusOr<ExecutionBudget::Ticket> b = budget.Admit();
    ASSERT_TRUE(b.ok());
    const absl::Status status = b->Reserve(500);
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(status.message().find("needs 500 bytes"), std::string::npos)
        << status;
    EXPECT_NE(status.message().find("only 400"), std::string::npos) << status;
    ExecutionBudget::Ticket moved = std::move(*a);
    EXPECT_EQ(moved.reserved_bytes(), 600);
    EXPECT_EQ(budget.reserved_bytes(), 600);
  }
  EXPECT_EQ(budget.reserved_bytes(), 0);
  EXPECT_EQ(budget.executions(), 0);
}

}  // namespace
}  // namespace ringattn
