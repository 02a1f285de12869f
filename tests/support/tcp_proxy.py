#!/usr/bin/env python3
"""A TCP forwarder for tests: 127.0.0.1:PORT -> 127.0.0.1:TARGET.

Tests put it between a client and a server whose state must survive (moto_server keeps its
buckets in memory) and SIGKILL it to play the server's death: every connection through it is
cut mid-transfer and new ones are refused until the test starts it again on the same port.
Prints one line per connection it forwards.

    tcp_proxy.py PORT TARGET
"""
import asyncio
import sys


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(port, target):
    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.close()
            return
        print("connection", flush=True)
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)
    print("listening on", port, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: tcp_proxy.py PORT TARGET")
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
