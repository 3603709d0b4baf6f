// FreePort: the port it names can be bound on 127.0.0.1 right after.

#include "client/free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

TEST(FreePortTest, NamesAPortThatCanBeBound) {
  const absl::StatusOr<int> port = FreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  ASSERT_LE(*port, 65535);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(*port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
      << "port " << *port;
  close(fd);
}

}  // namespace
}  // namespace ringattn
