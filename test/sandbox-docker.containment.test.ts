/**
 * The shared containment cases (test/containment-cases.ts) against
 * DockerSandbox: all of them on the BusyBox image (its nc is the network
 * probe's client), the command limits on the GNU image too. `network: true`
 * means the host's network: the test daemon creates no bridge.
 */
import { DockerSandbox } from "../sandboxes/docker.js";
import { commandCases, containmentCases, type ContainmentLimits } from "./containment-cases.js";
import { TEST_LABELS, dockerService } from "./support/sandbox-services.js";

const { socket, images } = dockerService();

const create = (image: string) => (limits: ContainmentLimits) =>
  DockerSandbox.create({
    image,
    docker: socket,
    labels: TEST_LABELS,
    network: limits.network ? "host" : "none",
    memoryMb: limits.memoryMb,
    pidsLimit: limits.maxProcesses,
  });

containmentCases({ name: "docker (busybox)", create: create(images.busybox) });
commandCases({ name: "docker (gnu)", create: create(images.gnu) });
