import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/", "node_modules/", ".services/", ".strata/", ".scratch/", ".node24/"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      "@typescript-eslint/no-explicit-any": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "no-control-regex": "off",
    },
  },
  {
    // core/ must run in a browser: no Node built-ins.
    files: ["core/**/*.ts", "backends/state.ts", "backends/composite.ts", "stores/memory.ts"],
    rules: {
      "no-restricted-imports": ["error", { patterns: ["node:*", "fs", "path", "os", "child_process", "crypto", "buffer"] }],
    },
  },
);
