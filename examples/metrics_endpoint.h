// MetricsEndpoint: the smallest HTTP server that answers GET /metrics on a loopback port with
// the latest Prometheus text the loop handed it. For server_loop only; a real server has its
// own HTTP stack and only needs kvpage::RenderPrometheus.
#ifndef KVPAGE_EXAMPLES_METRICS_ENDPOINT_H_
#define KVPAGE_EXAMPLES_METRICS_ENDPOINT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

class MetricsEndpoint {
 public:
  // Listens on 127.0.0.1:port (0: a free port, see port()).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const std::string error = std::strerror(errno);
      close(fd);
      return absl::UnavailableError(absl::StrCat("metrics port ", port, ": ", error));
    }
    return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(fd, ntohs(addr.sin_port)));
  }
  ~MetricsEndpoint() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }
  void Set(std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = std::move(body);
  }

 private:
  MetricsEndpoint(int fd, int port) : fd_(fd), port_(port), thread_([this] { Serve(); }) {}

  void Serve() {
    while (!stop_) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const int client = accept(fd_, nullptr, nullptr);
      if (client < 0) continue;
      char request[1024];
      const ssize_t n = recv(client, request, sizeof(request) - 1, 0);
      const std::string head(request, n > 0 ? static_cast<size_t>(n) : 0);
      std::string body;
      std::string status = "404 Not Found";
      if (head.rfind("GET /metrics ", 0) == 0) {
        std::lock_guard<std::mutex> lock(mu_);
        body = body_;
        status = "200 OK";
      }
      const std::string reply =
          absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: text/plain; version=0.0.4\r\n",
                       "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
      for (size_t sent = 0; sent < reply.size();) {
        const ssize_t k = send(client, reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
        if (k <= 0) break;
        sent += static_cast<size_t>(k);
      }
      close(client);
    }
  }

  int fd_;
  int port_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string body_;
  std::thread thread_;  // last: starts once the rest is built
};

#endif  // KVPAGE_EXAMPLES_METRICS_ENDPOINT_H_
