#pragma once
#include <mpi.h>

#include "transport/bootstrap.hpp"

namespace gradcomm::transport {

/// Bootstrap over an MPI communicator (MPI_Allgather and MPI_Allgatherv).
class MpiBootstrap : public Bootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> allgather(const std::string& mine) override;
  std::string describe() const override { return "MPI"; }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace gradcomm::transport
