/**
 * Durable key-value storage for the outbox and the budget ledger: `MemoryStore` (tests), `IndexedDBStore`
 * (browsers), `FileStore` (Node, in ./node.js) and `asyncStorageStore` (React Native's AsyncStorage or any
 * store with the same multi-key calls). A write has completed durably when its promise resolves.
 */

/** What the outbox and ledger need from a store; values are strings. */
export interface KeyValueStore {
  get(key: string): Promise<string | undefined>;
  /** Write every entry; all or nothing where the store can (IndexedDB, FileStore). */
  setMany(entries: ReadonlyArray<readonly [string, string]>): Promise<void>;
  deleteMany(keys: readonly string[]): Promise<void>;
  /** Every key starting with `prefix`, in lexicographic order. */
  keys(prefix: string): Promise<string[]>;
}

/** A store in memory: lost on restart (tests, or apps that accept losing queued reports). */
export class MemoryStore implements KeyValueStore {
  readonly data = new Map<string, string>();
  async get(key: string): Promise<string | undefined> {
    return this.data.get(key);
  }
  async setMany(entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    for (const [k, v] of entries) this.data.set(k, v);
  }
  async deleteMany(keys: readonly string[]): Promise<void> {
    for (const k of keys) this.data.delete(k);
  }
  async keys(prefix: string): Promise<string[]> {
    return [...this.data.keys()].filter((k) => k.startsWith(prefix)).sort();
  }
}

function request<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/** A store in one IndexedDB object store (browsers); each write is one durable transaction. */
export class IndexedDBStore implements KeyValueStore {
  private constructor(private readonly db: IDBDatabase, private readonly storeName: string) {}

  /** Open (creating if needed) database `name` with one object store. */
  static async open(name = "deniable", storeName = "kv"): Promise<IndexedDBStore> {
    const req = indexedDB.open(name, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(storeName);
    return new IndexedDBStore(await request(req), storeName);
  }

  private async write(fill: (store: IDBObjectStore) => void): Promise<void> {
    const tx = this.db.transaction(this.storeName, "readwrite", { durability: "strict" });
    fill(tx.objectStore(this.storeName));
    await new Promise<void>((resolve, reject) => {
      tx.oncomplete = () => resolve();
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error ?? new Error("IndexedDB transaction aborted"));
    });
  }

  async get(key: string): Promise<string | undefined> {
    const tx = this.db.transaction(this.storeName, "readonly");
    return (await request(tx.objectStore(this.storeName).get(key))) as string | undefined;
  }
  setMany(entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    return this.write((store) => entries.forEach(([k, v]) => store.put(v, k)));
  }
  deleteMany(keys: readonly string[]): Promise<void> {
    return this.write((store) => keys.forEach((k) => store.delete(k)));
  }
  async keys(prefix: string): Promise<string[]> {
    const tx = this.db.transaction(this.storeName, "readonly");
    const range = IDBKeyRange.bound(prefix, prefix + "\uffff");
    return ((await request(tx.objectStore(this.storeName).getAllKeys(range))) as string[]).sort();
  }
}

/** The calls of React Native's AsyncStorage this SDK uses (or any store offering them). */
export interface AsyncStorageLike {
  getItem(key: string): Promise<string | null>;
  multiSet(pairs: Array<[string, string]>): Promise<void>;
  multiRemove(keys: string[]): Promise<void>;
  getAllKeys(): Promise<readonly string[]>;
}

/** Adapt an AsyncStorage-like object (React Native) to a KeyValueStore; keys get `namespace`. */
export function asyncStorageStore(storage: AsyncStorageLike, namespace = "deniable:"): KeyValueStore {
  return {
    get: async (key) => (await storage.getItem(namespace + key)) ?? undefined,
    setMany: (entries) => storage.multiSet(entries.map(([k, v]) => [namespace + k, v])),
    deleteMany: (keys) => storage.multiRemove(keys.map((k) => namespace + k)),
    keys: async (prefix) =>
      (await storage.getAllKeys())
        .filter((k) => k.startsWith(namespace + prefix))
        .map((k) => k.slice(namespace.length))
        .sort(),
  };
}
