import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 180_000,
    // Service-backed suites share one PostgreSQL, Redis, dockerd and sshd; two workers suit the 2-core machine.
    maxWorkers: 2,
  },
});
