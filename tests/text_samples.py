"""Real sentences in many languages, with the legacy encodings their users really had.

Used by the text tests and by ``bench/clean_text.py`` to build files in those encodings. Each
entry: language -> (legacy encodings that can hold it, a paragraph of ordinary prose).
"""

from __future__ import annotations

LANGUAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "zh-Hans": (("gbk", "gb18030"), (
        "今天天气很好，我们决定去公园散步。公园里有很多人，有的在跑步，有的在下棋，还有几个孩子在放风筝。"
        "一只小猫躺在长椅下面晒太阳，看起来非常舒服。我们在湖边坐了一会儿，聊了聊最近读过的书和看过的电影。"
        "傍晚的时候，天空变成了橘红色，我们才慢慢地走回家。晚饭吃的是妈妈做的红烧肉和西红柿炒鸡蛋。")),
    "zh-Hant": (("big5", "cp950"), (
        "今天天氣很好，我們決定去公園散步。公園裡有很多人，有的在跑步，有的在下棋，還有幾個孩子在放風箏。"
        "一隻小貓躺在長椅下面曬太陽，看起來非常舒服。我們在湖邊坐了一會兒，聊了聊最近讀過的書和看過的電影。"
        "傍晚的時候，天空變成了橘紅色，我們才慢慢地走回家。晚飯吃的是媽媽做的紅燒肉和番茄炒蛋。")),
    "ja": (("shift_jis", "cp932", "euc_jp"), (
        "今日はとても良い天気だったので、私たちは公園へ散歩に行きました。公園にはたくさんの人がいて、"
        "ジョギングをしている人や将棋を指している人、凧揚げをしている子供たちもいました。"
        "ベンチの下では小さな猫が日向ぼっこをしていて、とても気持ちよさそうでした。"
        "夕方になると空がオレンジ色に染まり、私たちはゆっくりと家に帰りました。")),
    "ko": (("euc_kr", "cp949"), (
        "오늘은 날씨가 아주 좋아서 우리는 공원에 산책을 가기로 했습니다. 공원에는 사람들이 많았는데, "
        "달리기를 하는 사람도 있고 장기를 두는 사람도 있었으며 연을 날리는 아이들도 몇 명 있었습니다. "
        "작은 고양이 한 마리가 벤치 아래에서 햇볕을 쬐고 있었는데 아주 편안해 보였습니다. "
        "저녁이 되자 하늘이 주황색으로 물들었고 우리는 천천히 집으로 돌아왔습니다.")),
    "ru": (("koi8_r", "cp1251"), (
        "Сегодня была прекрасная погода, и мы решили пойти погулять в парк. В парке было много людей: "
        "одни бегали, другие играли в шахматы, а несколько детей запускали воздушного змея. "
        "Маленький котёнок грелся на солнце под скамейкой и выглядел очень довольным. "
        "Вечером небо стало оранжевым, и мы медленно пошли домой, обсуждая прочитанные книги.")),
    "uk": (("cp1251", "koi8_u"), (
        "Сьогодні була чудова погода, і ми вирішили піти на прогулянку до парку. У парку було багато людей: "
        "хтось бігав, хтось грав у шахи, а кілька дітей запускали повітряного змія. "
        "Маленьке кошеня грілося на сонці під лавкою і виглядало дуже задоволеним. Ввечері ми повернулися додому.")),
    "fr": (("cp1252", "iso8859_15"), (
        "Aujourd'hui, il faisait très beau, alors nous avons décidé d'aller nous promener au parc. "
        "Il y avait beaucoup de monde : certains couraient, d'autres jouaient aux échecs, et quelques enfants "
        "faisaient voler un cerf-volant. Un petit chat se prélassait au soleil sous un banc, l'air très à l'aise. "
        "Le soir, le ciel est devenu orange et nous sommes rentrés tranquillement à la maison. Ça, c'était génial !")),
    "de": (("cp1252", "iso8859_15"), (
        "Heute war das Wetter sehr schön, deshalb haben wir beschlossen, im Park spazieren zu gehen. "
        "Im Park waren viele Leute: Einige joggten, andere spielten Schach, und ein paar Kinder ließen einen "
        "Drachen steigen. Eine kleine Katze lag unter einer Bank in der Sonne und sah sehr zufrieden aus. "
        "Am Abend färbte sich der Himmel orange, und wir gingen gemütlich nach Hause. Schöne Grüße aus München!")),
    "es": (("cp1252",), (
        "Hoy hacía muy buen tiempo, así que decidimos ir a pasear al parque. Había mucha gente: algunos corrían, "
        "otros jugaban al ajedrez y unos niños volaban una cometa. Un gatito tomaba el sol debajo de un banco y "
        "parecía muy cómodo. Por la tarde, el cielo se volvió naranja y volvimos despacio a casa. ¡Qué día tan bonito!")),
    "pl": (("cp1250", "iso8859_2"), (
        "Dzisiaj pogoda była piękna, więc postanowiliśmy pójść na spacer do parku. W parku było dużo ludzi: "
        "jedni biegali, inni grali w szachy, a kilkoro dzieci puszczało latawca. Mały kotek wygrzewał się "
        "w słońcu pod ławką i wyglądał na bardzo zadowolonego. Wieczorem niebo zrobiło się pomarańczowe.")),
    "cs": (("cp1250",), (
        "Dnes bylo krásné počasí, a tak jsme se rozhodli jít na procházku do parku. V parku bylo hodně lidí: "
        "někteří běhali, jiní hráli šachy a několik dětí pouštělo draka. Malé koťátko se vyhřívalo na slunci "
        "pod lavičkou a vypadalo velmi spokojeně. Večer se obloha zbarvila do oranžova a my jsme šli pomalu domů.")),
    "el": (("cp1253", "iso8859_7"), (
        "Σήμερα ο καιρός ήταν υπέροχος, γι' αυτό αποφασίσαμε να πάμε βόλτα στο πάρκο. Στο πάρκο υπήρχε πολύς "
        "κόσμος: άλλοι έτρεχαν, άλλοι έπαιζαν σκάκι και μερικά παιδιά πετούσαν χαρταετό. Ένα μικρό γατάκι "
        "λιαζόταν κάτω από ένα παγκάκι και φαινόταν πολύ ευχαριστημένο. Το βράδυ γυρίσαμε σιγά σιγά στο σπίτι.")),
    "tr": (("cp1254",), (
        "Bugün hava çok güzeldi, bu yüzden parkta yürüyüşe çıkmaya karar verdik. Parkta çok insan vardı: "
        "bazıları koşuyor, bazıları satranç oynuyor, birkaç çocuk da uçurtma uçuruyordu. Küçük bir kedi yavrusu "
        "bankın altında güneşleniyordu ve çok mutlu görünüyordu. Akşam gökyüzü turuncuya döndü ve eve yavaşça döndük.")),
    "ar": (("cp1256",), (
        "كان الطقس جميلاً جداً اليوم، لذلك قررنا أن نذهب في نزهة إلى الحديقة. كان هناك الكثير من الناس: "
        "بعضهم يركض، وبعضهم يلعب الشطرنج، وبعض الأطفال يطيرون طائرة ورقية. كانت قطة صغيرة تستلقي تحت "
        "المقعد في الشمس وتبدو مرتاحة جداً. في المساء أصبحت السماء برتقالية وعدنا ببطء إلى البيت.")),
    "he": (("cp1255",), (
        "היום מזג האוויר היה נפלא, ולכן החלטנו לצאת לטיול בפארק. בפארק היו הרבה אנשים: חלקם רצו, חלקם "
        "שיחקו שחמט, וכמה ילדים העיפו עפיפון. חתלתול קטן השתזף בשמש מתחת לספסל ונראה מרוצה מאוד. "
        "בערב השמיים נצבעו בכתום וחזרנו לאט הביתה.")),
}

# Correct text that a "fixer" must leave exactly as it is.
VALID_UNICODE = [
    *(text for _encs, text in LANGUAGES.values()),
    "Emoji 👍🏽 👨‍👩‍👧 🇫🇷 and maths ∑∫√∞ ≤ ≥ ± × ÷ α β γ ∀x∈ℝ",
    "Typography: “double” ‘single’ – en — em … • © ® ™ ½ ¼ ¾ € £ ¥",
    "Fullwidth ＡＢＣ１２３ and halfwidth ｶﾀｶﾅ stay as written; ﬁ ligatures too.",
    "हिन्दी में एक वाक्य। ภาษาไทยเป็นภาษาที่สวยงาม។ Tiếng Việt có dấu: Hà Nội, Sài Gòn.",
    "São Paulo, Ñandú, Ærø, Øresund, Łódź, Göteborg, İstanbul, Reykjavík",
    "Persian with a ZWNJ: می‌خواهم — and a RTL mark \u200f in Hebrew: שלום",
    "Box drawing ┌─┬─┐ │a│b│ └─┴─┘ and arrows ← ↑ → ↓ ⇒",
]

# Sentences holding the letters where related code pages disagree (cp1252 and ISO-8859-15 on
# "œ€", cp1250 and ISO-8859-2 on "śźąšž", cp1253 and ISO-8859-7 on "Ά", cp1251, KOI8-R, ISO-8859-5,
# DOS cp866 and MacCyrillic on everything), each with the encodings that can hold it.
CONFUSABLE: dict[str, tuple[tuple[str, ...], str]] = {
    "fr": (("cp1252", "iso8859_15"),
           "Le cœur de l'œuvre coûte 15 € ; « Ça va ? » dit-elle. Il a mangé une crème brûlée à Noël."),
    "de": (("cp1252",), "„Schöne Grüße“, sagte er – und zahlte 20 € für die Blumen. Übermorgen fährt er nach Köln."),
    "el": (("cp1253", "iso8859_7"),
           "Άλλοι έτρεχαν στο πάρκο, ενώ η Άννα διάβαζε ένα βιβλίο. Αύριο θα πάμε στην Αθήνα."),
    "pl": (("cp1250", "iso8859_2"),
           "Kot śpi na kanapie, a pies je mięso. Źle się dzieje, gdy są źli. Ślązacy mają swoją gwarę."),
    "cs": (("cp1250", "iso8859_2"), "Žluťoučký kůň úpěl ďábelské ódy. Šťastný pes běží přes louku."),
    "ru": (("cp1251", "koi8_r", "iso8859_5", "cp866", "mac_cyrillic"),
           "Съешь же ещё этих мягких французских булок, да выпей чаю. Широкая электрификация южных "
           "губерний даст мощный толчок подъёму сельского хозяйства."),
    "th": (("cp874", "tis_620"), "ภาษาไทยเป็นภาษาที่สวยงาม วันนี้อากาศดีมาก เราจึงไปเดินเล่นที่สวนสาธารณะ"),
    "lt": (("cp1257", "iso8859_13"), "Šiandien labai graži diena, einame į parką. Vaikai žaidžia prie ežero, o katė miega."),
    "ar": (("cp1256", "iso8859_6"), "كان الطقس جميلا جدا اليوم، لذلك قررنا أن نذهب في نزهة إلى الحديقة."),
    "tr": (("cp1254", "iso8859_9"), "Işık, ağaç, çiçek, şeker, göz ve üzüm. Güneşli bir günde İstanbul'da yürüdük."),
}
