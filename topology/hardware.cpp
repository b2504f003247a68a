// hwloc's description of this host. Optional: without hwloc (or when it
// fails) the view says so and everything else works unchanged.
#include "topology/topology_view.hpp"

#if GRADCOMM_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace gradcomm::topology {

namespace {

HostHardware load() {
  HostHardware hw;
#if GRADCOMM_HAVE_HWLOC
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) return hw;
  // Keep OS devices (NICs) that hwloc otherwise filters out.
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return hw;
  }
  hw.detected = true;
  hw.numaNodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  hw.sockets = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  hw.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  for (hwloc_obj_t o = hwloc_get_next_osdev(topo, nullptr); o; o = hwloc_get_next_osdev(topo, o)) {
    if ((o->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK || o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) &&
        o->name) {
      hw.nics.push_back(o->name);
    }
  }
  hwloc_topology_destroy(topo);
#endif
  return hw;
}

}  // namespace

HostHardware detectHardware() {
  // Loading takes milliseconds (it scans PCI devices): once per process.
  static const HostHardware hw = load();
  return hw;
}

}  // namespace gradcomm::topology
