#!/usr/bin/env python3
"""The agent's status page in a real browser: Debian's headless Chromium loads the page of a
running dist-launch job (two dist-test-worker ranks counting steps at different paces), and

  - its screenshot, decoded here (PNG by hand: zlib and struct, no imaging library), is not blank,
    has the plot area, and in it both ranks' line colours, the slower rank 1 drawn above rank 0;
  - its DOM after the page's JavaScript ran (--dump-dom) has a row per rank, a plotted line per
    rank, and at least one poll of status.json merged.

With --token, the agent asks for a token (DIST_LAUNCH_METRICS_TOKEN_FILE), the page is opened as
http://127.0.0.1:PORT/?token=... and its own polls must carry it; and the worker runs under a name
that is not UTF-8 (caf\xe9-worker), which the page shows with U+FFFD in the byte's place.

Exits 77 (skipped) when Chromium is not installed (scripts/install-deps.sh installs it).
"""
import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib

PLOT_BACKGROUND = (0xFB, 0xFB, 0xF7)  # #chart .plotarea
RANK_COLOURS = {0: (0x1F, 0x77, 0xB4), 1: (0xD6, 0x27, 0x28)}  # the page's PALETTE[0], [1]
DEADLINE_S = 60


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser(binary, profile, *args):
    """Chromium headless on a page of this machine (as root it needs --no-sandbox)."""
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--disable-extensions", "--hide-scrollbars",
               "--user-data-dir=" + profile, *args]
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=90,
                          check=False)


def decode_png(data):
    """Width, height and rows of (r, g, b) tuples of an 8-bit RGB or RGBA, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, header = 8, [], None
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        at += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    channels = 4 if colour_type == 6 else 3
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous))
        elif kind == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = previous[i]
                c = previous[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, channels)])
        previous = line
    return width, height, rows


def near(pixel, colour, tolerance=40):
    return all(abs(p - c) <= tolerance for p, c in zip(pixel, colour))


def check_screenshot(path):
    with open(path, "rb") as f:
        width, height, rows = decode_png(f.read())
    pixels = [p for row in rows for p in row]
    white = sum(1 for p in pixels if p == (255, 255, 255))
    assert len(set(pixels)) > 50, "a blank or nearly blank screenshot"
    assert white < 0.97 * len(pixels), "almost everything is white: nothing was drawn"
    # The plot area: the box of its background colour.
    box = [(x, y) for y, row in enumerate(rows) for x, p in enumerate(row) if p == PLOT_BACKGROUND]
    assert box, "no plot area in the screenshot"
    x0, x1 = min(x for x, _ in box), max(x for x, _ in box)
    y0, y1 = min(y for _, y in box), max(y for _, y in box)
    assert x1 - x0 > 400 and y1 - y0 > 150, ("plot area", x0, y0, x1, y1)
    heights = {}
    for rank, colour in RANK_COLOURS.items():
        ys = [y for y in range(y0, y1 + 1) for x in range(x0, x1 + 1) if near(rows[y][x], colour)]
        assert len(ys) >= 20, "rank %d's line is not in the plot area (%d pixels)" % (rank, len(ys))
        heights[rank] = sorted(ys)[len(ys) // 2]
    # Rank 1 steps at half rank 0's pace: its step time is higher, drawn above (a smaller y).
    assert heights[1] < heights[0], ("rank 1 drawn above rank 0", heights)
    print("screenshot %dx%d: plot area (%d,%d)-(%d,%d), ranks' lines at y %s" %
          (width, height, x0, y0, x1, y1, heights))


def check_dom(dom, odd_name):
    polls = re.search(r'<body[^>]*data-polls="(\d+)"', dom)
    assert polls and int(polls.group(1)) >= 1, "the page never merged a poll of status.json"
    for rank in RANK_COLOURS:
        assert '<tr data-rank="%d"' % rank in dom, "no row for rank %d" % rank
        line = re.search(r'<path class="series" data-rank="%d" d="(M[^"]*)"' % rank, dom)
        assert line, "no line for rank %d" % rank
        points = re.findall(r"[ML][0-9.]+,[0-9.]+", line.group(1))
        assert len(points) >= 2, "rank %d's line has %d point(s)" % (rank, len(points))
    assert "<title>dist-launch pagejob: running</title>" in dom, "the title says the job's state"
    if odd_name:
        assert "caf\ufffd-worker" in dom, "the script's name, its byte replaced, in the events"
    print("DOM: %s polls merged, a row and a line per rank" % polls.group(1))


def wait_for(what, condition, timeout=DEADLINE_S):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--token", action="store_true",
                        help="ask for a token, and run the worker under a name that is not UTF-8")
    args = parser.parse_args()
    binary = chromium()
    if not binary:
        print("skipped: no chromium (apt-get install chromium; scripts/install-deps.sh does)")
        return 77
    with tempfile.TemporaryDirectory(prefix="dist-status-page-") as tmp:
        log_path = os.path.join(tmp, "launch.log")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("DIST_LAUNCH_METRICS_TOKEN_FILE", None)
        worker, token, query, headers = args.worker, None, "", {}
        if args.token:
            token = "0123456789abcdef0123456789abcdef"
            token_file = os.path.join(tmp, "metrics.token")
            with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(token + "\n")
            env["DIST_LAUNCH_METRICS_TOKEN_FILE"] = token_file
            worker = os.path.join(os.fsencode(tmp), b"caf\xe9-worker")
            os.symlink(args.worker, worker)
            query = "?token=" + token
            headers = {"Authorization": "Bearer " + token}
        with open(log_path, "w") as log:
            agent = subprocess.Popen(
                [args.launcher, "--nproc-per-node", "2", "--metrics-port", "0", "--rdzv-id",
                 "pagejob", "--no-python", worker, "progress", "40", "forever"],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            def served():
                with open(log_path, errors="replace") as f:
                    m = re.search(r"serving the status page at http://[^ ]*:(\d+)/", f.read())
                return m and int(m.group(1))
            port = wait_for("the agent's status page", served)
            url = "http://127.0.0.1:%d/" % port

            if token:
                try:
                    urllib.request.urlopen(url + "status.json", timeout=5)
                    raise AssertionError("status.json answered without the token")
                except urllib.error.HTTPError as e:
                    assert e.code == 401, e.code

            def plotted():  # three measured samples a rank: lines to draw
                request = urllib.request.Request(url + "status.json", headers=headers)
                with urllib.request.urlopen(request, timeout=5) as answer:
                    ranks = json.load(answer)["history"]["ranks"]
                return all(sum(v is not None for v in ranks.get(str(r), {}).get("beat_s", [])) >= 3
                           for r in RANK_COLOURS)
            wait_for("three samples of each rank", plotted)

            shot = os.path.join(tmp, "page.png")
            taken = browser(binary, os.path.join(tmp, "profile-shot"), "--window-size=1100,900",
                            "--virtual-time-budget=2500", "--screenshot=" + shot, url + query)
            assert os.path.exists(shot), "no screenshot: %s" % taken.stderr.decode()[-2000:]
            check_screenshot(shot)

            dumped = browser(binary, os.path.join(tmp, "profile-dom"),
                             "--virtual-time-budget=3500", "--dump-dom", url + query)
            check_dom(dumped.stdout.decode(), odd_name=args.token)
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                code = agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
                code = agent.wait()
        if code != 128 + signal.SIGTERM and code != -signal.SIGTERM:
            with open(log_path, errors="replace") as f:
                print(f.read())
            raise AssertionError("dist-launch ended %s after SIGTERM" % code)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
