import { afterAll } from "vitest";
import { runConformance } from "../conformance/index.js";
import { SharedContainer, dockerService } from "./support/sandbox-services.js";

const { images } = dockerService();

// The suite writes names the default secrets preset denies (.env, …): this file tests the backend's semantics, so it opts out; test/permissions.test.ts covers the preset.
for (const [name, image] of Object.entries(images)) {
  // One container per image; every test gets a fresh workspace directory in it.
  const shared = new SharedContainer(image);
  afterAll(() => shared.dispose());
  runConformance({
    name: `DockerSandbox (${name})`,
    create: () => shared.fresh({ permissions: false }),
    root: (sandbox) => sandbox.workspace,
    destroy: (sandbox) => sandbox.close(),
    close: (sandbox) => sandbox.close(),
    // Every operation is a docker exec (~50-80 ms); fewer property runs keep the file near a minute per image.
    capabilities: { execute: true, propertyRuns: 10, mergedStderr: true },
  });
}
